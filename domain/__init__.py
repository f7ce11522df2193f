"""Pure rules of Helios (stdlib only), in packages layered as `domain-packages` in pyproject.toml
orders them; each package's docstring says what it owns."""
