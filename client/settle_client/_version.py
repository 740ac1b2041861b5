"""The package version: the one place it is written (pyproject.toml reads it, so do the User-Agent and
``settle --version``)."""

VERSION = "0.1.0"
