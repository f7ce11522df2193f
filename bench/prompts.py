"""The chat questions every benchmark sends, so their runs are comparable."""

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
