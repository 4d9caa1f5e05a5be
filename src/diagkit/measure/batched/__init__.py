"""Batched device arithmetic: per-tensor work run as one kernel per shape and dtype (`kernels`,
`buckets`), and reading a step's results back with one transfer per device (`readback`).

No hooks here. Imported by the other rooms of `measure` (`change`, `model`, `step`); imports
nothing of diagkit but `core`.
"""
