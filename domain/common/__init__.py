"""The shared kernel every other domain package speaks: the domain's errors, each carrying the
OpenAI error fields the HTTP adapter renders (`errors`); the integer ranges of request fields,
checked before any rule quotes a field's value (`ranges`); and the JSON object type that
presentation builds (`wire`). It imports nothing of the domain, so anything may import it.
"""
