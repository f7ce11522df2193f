"""The serving contract between host and core (contracts/buffers.md, core.proto): the ABI6
completion records, the only way a step's outcome reaches the host (`records`), and what the
host reads back from one submitted step, its records with their logprob and prompt-score
payload and the lanes the executor retired (`frames`); the fixed geometry an executor declares,
within which the engine plans (`geometry`); the table of named buffers (`buffers`); what a core
declares (`declarations`); the logprob capability it serves (`capabilities`); and the
validation of a core's manifest, its buffers and graphs, into that capability
(`core_validation`, `graph_validation`).
"""
