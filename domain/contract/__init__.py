"""The serving contract between host and core (contracts/buffers.md, core.proto): the ABI6
completion records, the only way a step's outcome reaches the host (`records`); the table of
named buffers (`buffers`); what a core declares (`declarations`); the logprob capability it
serves (`capabilities`); and the validation of a core's manifest, its buffers and graphs, into
that capability (`core_validation`, `graph_validation`).
"""
