"""Contract tests: the HTTP app fuzzed against contracts/openapi.yaml."""
