"""Measuring: the only layer that touches torch hooks and tensors under training.

It produces the two tables of `diagkit.core.schema` (`params` rows and `steps`), reads
checkpoints, and restores what a run changed. It judges nothing.
"""
