"""Output parsers: reasoning and tool-call spans of a choice's text, and entry attribution."""
