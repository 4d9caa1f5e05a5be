"""The package version (one home: `diagkit.__version__` and `diagkit --version` read it)."""

VERSION = "0.1.0"
