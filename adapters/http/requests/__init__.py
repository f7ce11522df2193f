"""Request bodies, declared once per endpoint and decoded into typed structures.

Each module declares one endpoint's body as msgspec structures whose field types carry their
ranges, enums and the wording of their 400s (`declared`), and builds the domain's requests from
it; `decoding` is the one path from the library's errors to the OpenAI envelope, naming the
top-level field in `param` and the whole path in the message. `sampling` is the sampling build
that completions, chat and Responses share.
"""
