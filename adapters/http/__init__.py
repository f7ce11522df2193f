"""Falcon application serving the OpenAI-compatible API."""
