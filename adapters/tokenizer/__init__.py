"""Tokenizers backed by Hugging Face `tokenizers` and a Jinja chat template."""
