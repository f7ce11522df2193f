"""Output parsers: reasoning and tool-call spans of a choice's text, and the attribution of its
logprob entries to content. They read the emitted deltas (`domain.emission.outputs`) and produce
parsed deltas (`parsed`); `build` picks a choice's parser from its configuration, so the
interface never has to import its implementations (`choice`, `forced`, `hermes`, `spans`);
`settings` reads the server's parser flags. How parsed output looks on the wire lives in
`domain.presentation.parsed`.
"""
