"""The bottom layer: result types, the two tables' schema, severity, options, errors, files.

Every other layer may import from here; nothing here imports from them (see
docs/development.md, "Layout", for the layering, and `tests/test_layers.py` for its check).
"""
