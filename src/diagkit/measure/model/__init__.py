"""What the model holds: which tensors exist and which optimizer groups hold them (`inventory`),
tensors that train outside `.parameters()` (`unregistered`, `step_graph`, `attribute_paths`),
hooks made safe to save (`hook_ref`), the meta-device dry run (`meta_pass`) and the bitwise
restore of what a run touched (`restore`).

Imports `engines` and `batched`; imported by `step`, `clock` and run.
"""
