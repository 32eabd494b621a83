"""The package version (one place: the root package, run records and plugin listings read it)."""

__version__ = "0.1.0"
