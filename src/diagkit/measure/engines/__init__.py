"""The training engines: what diagkit sees under each wrapper (`unwrap`), each engine's own view
of its tensors (`fsdp1`, `shards` for FSDP2, `zero` for DeepSpeed, `ddp_facts`), and what it
refuses before anything runs (`refused`).

Imported by `model` and `step`, and by run; imports nothing of diagkit but `core`.
"""
