"""The Responses API: the assembler that turns a choice's parsed deltas into stream events and the
whole response alike (`assembler`), the wire objects of responses, output items and usage
(`objects`), and the store that `previous_response_id` continues and `GET /v1/responses/{id}`
reads (`store`). It is the top of the domain's layers.
"""
