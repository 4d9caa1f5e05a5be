"""Why a tensor kept in bfloat16 or float16 can look `stalled`: its updates round away.

A parameter stored in a 16-bit float with no float32 master copy is updated in that dtype: the
new value `w - update` is rounded to the nearest representable number, and an update smaller
than half an ulp of `w` (about |w| * eps / 2) rounds back to `w` exactly. With a small lr that
is every update: the tensor gets gradients and an optimizer steps it, yet it never changes.
That is still `stalled` (SPEC's meaning holds word for word); this module only says why.
"""

from __future__ import annotations

import math

import pandas as pd

# dtype as the params table writes it -> (short name, eps: the ulp of 1.0, torch.finfo's)
LOW_PRECISION = {"torch.bfloat16": ("bfloat16", 2.0 ** -7),
                 "torch.float16": ("float16", 2.0 ** -10)}


def rounded_away(group: pd.DataFrame) -> pd.DataFrame:
    """The rows of `group` kept in a 16-bit float that an update could have moved: lr > 0 and
    a non-zero finite gradient (the only way such a tensor stays bit-identical)."""
    low = group["dtype"].astype(str).isin(LOW_PRECISION)
    lr = pd.to_numeric(group["lr"], errors="coerce")
    grad = pd.to_numeric(group["grad_norm"], errors="coerce")
    return group[low & (lr > 0) & (grad > 0) & grad.map(math.isfinite)]


def rounding_why(rows: pd.DataFrame, everyone: bool) -> str:
    """The sentence that names `rows` (from `rounded_away`) and says why they cannot move.
    `everyone`: they are the whole finding, so they need not be named again."""
    first = rows.iloc[0]
    short, eps = LOW_PRECISION[str(first["dtype"])]
    rms = float(first["grad_norm"]) / math.sqrt(max(int(first["numel"]), 1))
    names = ", ".join(f"`{n}`" for n in rows["name"].head(4)) + (
        f" and {len(rows) - 4} more" if len(rows) > 4 else "")
    who = "it is" if everyone and len(rows) == 1 else (
        "they are" if everyone else f"{names} {'is' if len(rows) == 1 else 'are'}")
    lr = float(first["lr"])
    return (f"{who} kept in {short} with no float32 master copy, so each update is rounded "
            f"to {short}, and one below half an ulp of the values (about |value| × "
            f"{eps / 2:.1g}) rounds back to the old value: here lr = {lr:.3g} and the gradient "
            f"is about {rms:.3g} per element (`{first['name']}`), an update of about "
            f"{lr * rms:.2g} (lr × gradient for SGD; about lr for Adam)")


PRECISION_FIX = ("Keep the parameters in float32 and train under torch.autocast(device, "
                 "dtype=torch.bfloat16) (the forward runs in bf16, the updates stay exact), or "
                 "keep a float32 master copy in the optimizer (mixed-precision / master-weights "
                 "optimizers); a larger lr only hides it.")
