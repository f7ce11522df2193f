"""Output parsers: the reasoning, content and tool-call spans of a choice's text. They read the
emitted deltas (`domain.emission.outputs`) and produce parsed deltas (`parsed`), giving content
the entries of the tokens that `domain.emission.entries` says it keeps; `build` picks a choice's
parser from its configuration, so the interface never has to import its implementations
(`choice`, `forced`, `hermes`, `spans`); `settings` reads the server's parser flags. How parsed
output looks on the wire lives in `domain.presentation.parsed`.
"""
