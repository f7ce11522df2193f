"""What a caller asks for, valid on construction: the completion or chat call as the API received
it (`api_request`), one prompt as the engine runs it with its choices, sampling and logprob
wishes (`engine_request`), the sampling settings (`sampling`), and what they fix for one choice
at admission, its seed, stop tokens, bans and output budget, with the sampling part of each of
its lanes (`choice_sampling`). Each checks its fields against `domain.common.ranges` and the
feature rules (logprobs, structured output, thinking budget) so that bad input is a 400 before
admission.
"""
