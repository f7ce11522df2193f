"""The torch model executor and its parts (docs/serving-paths.md); nothing heavy at import."""
