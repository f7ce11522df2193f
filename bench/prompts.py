"""The chat questions and the JSON schema every benchmark sends, so their runs are comparable."""

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Why is the sky blue?",
    "Write a haiku about autumn.",
    "What is 17 times 3?",
    "Explain photosynthesis briefly.",
    "Who wrote Hamlet?",
    "Give me a tip for learning Python.",
    "What is a prime number?",
    "Describe a cat in one sentence.",
    "What does a CPU do?",
    "How many legs does a spider have?",
    "Suggest a name for a dog.",
    "What is the boiling point of water?",
    "Translate hello to Spanish.",
    "Why do we sleep?",
]

# A person record: nested object, array with maxItems, enum, integer range, string patterns.
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "pattern": "^[a-z]{1,12}@[a-z]{1,12}\\.com$"},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
        "status": {"enum": ["active", "inactive", "banned"]},
    },
    "required": ["name", "age", "email", "address", "hobbies", "status"],
    "additionalProperties": False,
}
