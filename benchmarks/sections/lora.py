"""O. A LoRA fine-tune (r=8 on q/v, peft) of an 8-layer Llama: extra peak RSS per delta mode,
watched step against plain (A/A control), and the 70B LoRA plan's snapshot bytes on meta
(measured by benchmarks/lora_time.py; issue 35).
"""

from __future__ import annotations

import sys

from bench_common import Bench
from sections.memory import GOALS as MEMORY_GOALS

NAME = "lora"
# The goal is B's: extra memory within the trained tensors' bytes + its small constant.
GOALS: dict = {}
NEEDS = "peft"
MISSING = ("the LoRA Llama (O)", "skipped: peft is not installed", "-", "-")


def run(bench: Bench) -> None:
    """The LoRA fine-tune's memory, step time and 70B plan (`result["lora"]`)."""
    from lora_time import lora_lines, lora_memory, plan_70b, time_lora
    quick = bench.quick
    r = bench.result["lora"] = {}
    print("[lora] memory per mode ...", file=sys.stderr, flush=True)
    r["memory"] = lora_memory(quick)
    print("[lora] step time ...", file=sys.stderr, flush=True)
    r["time"] = time_lora(quick, rounds=2 if quick else 5)
    print("[lora] the 70B plan on meta ...", file=sys.stderr, flush=True)
    r["plan_70b"] = plan_70b()
    bench.lines += lora_lines(r, MEMORY_GOALS["memory_constant_mb"])
