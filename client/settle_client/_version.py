"""The package version (one place: pyproject.toml must say the same)."""

VERSION = "0.1.0"
