"""How a step's change of each tensor is measured: the `delta=` modes (`probes`), exact
snapshots (`exact_probe` over `snapshots`, with `snapshot_pass` and `parts`), fingerprints
without a copy (`fingerprint`, `sampled_probe`), and exact at the memory of what trains
(`split_probe`).

Imports only `batched`; imported by `step`.
"""
