"""Presentation: the wire objects of the OpenAI-compatible API, built from domain values so that
HTTP only serializes them. Completions, chat, usage, errors and the model list (`objects`),
logprob entries in vLLM's shapes with -inf, token strings, bytes and offsets (`logprobs`), and
parsed reasoning, content and tool calls (`parsed`). It reads emission, parser and logprob
values and is imported by nothing below it.
"""
