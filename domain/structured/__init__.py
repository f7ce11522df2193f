"""Structured output and tool choice: what an output is constrained to, the grammar spec that the
engine and the executors share (`grammar`); which `response_format`, `structured_outputs` and
`tools` requests get a 400 and which grammar each valid one asks for (`rules`); which `tools`
and `tool_choice` force calls, and of which functions (`tool_choice`); the JSON a forced call
must follow, with its output as `tool_calls` (`tool_calls`); the output constraint as a part of
one choice and of its lanes, with where the grammar starts (`constraint`); and the catch-up every
executor's grammar walk follows, restarting on a new epoch (`catch_up`). It imports only
`domain.common`.
"""
