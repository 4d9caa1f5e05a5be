"""Checkpoints on disk: which kind a path is (`kind`), reading them without running code (`read`,
`stream`, `shards`, `dcp`, `dcp_meta`), loading one into a model (`load`) and comparing two
(`diff`).

A room of its own: imports nothing else of `measure`; imported by run and present.
"""
