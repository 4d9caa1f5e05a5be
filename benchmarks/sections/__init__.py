"""The bench's sections, one module each, named for the figure it measures: step_time (A),
memory (B, and E's device memory), report (C), stride (D), watch (F), fsdp (G), imports (H),
whole (I), zero (J), live (K), call (L), group (M), meta (N), lora (O), compiled (P).

Each holds its goals (`GOALS`, the JSON's "goals") beside the code that measures the figure
and writes its rows, and a `run(bench)` the runner (`benchmarks/overhead.py`) calls. A section
imports `bench_common`, the helper script that measures it, or another section's `GOALS` where
it is judged by the same goal; never the runner.
"""
