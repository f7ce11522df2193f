"""The `helios` command line: composition roots for generate, serve and export."""
