"""Cores: the Protobuf manifest, exporting a model as a core, loading one with its capability."""
