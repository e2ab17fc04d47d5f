"""The package version, single-sourced for pyproject and `rlslice --version`."""

__version__ = "0.1.0"
