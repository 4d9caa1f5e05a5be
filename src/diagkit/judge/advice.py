"""Run-level advice: the right `find_unused_parameters` for DDP, and whether `static_graph`
is possible, each with its evidence. Which tensors are unused or used on some steps only is
read from their verdicts, never decided again here."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.format import human_bytes
from .findings import unused_tensors
from ..core.schema import FSDP1_SLICE, is_dtensor_placement


def build_advice(params: pd.DataFrame, steps: pd.DataFrame, ddp: dict | None = None,
                 cost: dict | None = None, wrappers=None) -> dict:
    """The right DDP flags for this model as observed, each with its evidence. In a
    distributed run, `ddp` is what DDP itself reported and `cost` the measured price of
    find_unused_parameters=True (see `diagkit.run.diagnose.worker`); `wrappers`: what the model was
    given in (a DeepSpeed engine has no such flag)."""
    model_names = set(params.loc[params["in_model"].astype(bool), "name"])
    s = steps[steps["name"].isin(model_names)]
    if "rank" in s.columns:  # every (rank, step) is one observation of what DDP will see
        s = s.assign(step=s["rank"].astype(str) + ":" + s["step"].astype(str))
        steps_word = "rank-steps"
    else:
        steps_word = "steps"
    n_steps = int(s["step"].nunique()) if len(s) else 0
    missed = unused_tensors(params)
    fup = _find_unused(missed, n_steps, steps_word)
    if "DeepSpeedEngine" in (wrappers or ()):
        fup["recommendation"] = ("the model runs under DeepSpeed, which has no "
                                 "find_unused_parameters: ZeRO reduces the gradients that exist "
                                 "(its ignore_unused_parameters, true by default, lets it step "
                                 "without the others). Under DDP: " + fup["recommendation"])
    elif _sharded_by(params):
        fup["recommendation"] = (f"the model is sharded by {_sharded_by(params)}, which has no "
                                 "find_unused_parameters: it reduces the gradients that exist. "
                                 "Under DDP: " + fup["recommendation"])
    if ddp is not None:
        fup["ddp"] = ddp
    if cost:
        fup["measured_cost"] = cost
        if cost.get("ratio"):
            fup["evidence"] += (f"; measured here: find_unused_parameters=True costs "
                                f"{cost['ratio']:.2f}x the step time of False "
                                f"(medians of {cost['rounds']} interleaved rounds)")
    static, static_evidence = _static_graph(s, n_steps, steps_word)
    return {"find_unused_parameters": fup,
            "static_graph": {"value": static, "evidence": static_evidence},
            "steps": n_steps}


def _sharded_by(params: pd.DataFrame) -> str | None:
    """Which FSDP shards every tensor of the model (DTensor shards: FSDP2; slices: FSDP1), or
    None: DDP's flag does not apply to either."""
    in_model = params[params["in_model"].astype(bool)]
    if "placement" not in params or not len(in_model):
        return None
    placements = in_model["placement"].fillna("")
    if placements.map(is_dtensor_placement).all():
        return "FSDP2 (fully_shard)"
    if (placements == FSDP1_SLICE).all():
        return "FSDP1 (FullyShardedDataParallel)"
    return None


def _find_unused(missed: dict, n_steps: int, steps_word: str) -> dict:
    """find_unused_parameters: needed when a tensor requiring grad misses a gradient."""
    never, sometimes = missed["unused"], missed["intermittent"]
    need = bool(never or sometimes)
    if n_steps == 0:
        evidence = "no step completed, so nothing was observed"
    elif not need:
        evidence = (f"every tensor that requires grad received a gradient on every one of "
                    f"the {n_steps} observed {steps_word}")
    else:
        parts = []
        if never:
            parts.append(f"{len(never)} tensor(s) requiring grad never received a gradient "
                         f"({human_bytes(missed['unused_bytes'])} of dead weight)")
        if sometimes:
            parts.append(f"{len(sometimes)} tensor(s) received gradients on some steps only")
        evidence = "; ".join(parts) + f" over {n_steps} {steps_word}"
    if never and not sometimes:
        recommendation = ("freeze or drop the never-used tensors (see the 'unused' findings), "
                          "then use find_unused_parameters=False")
    elif sometimes:
        recommendation = ("keep find_unused_parameters=True while the forward's branches are "
                          "data-dependent")
    else:
        recommendation = "use find_unused_parameters=False"
    return {"value": need, "evidence": evidence, "unused": never, "intermittent": sometimes,
            "unused_bytes": missed["unused_bytes"], "after_fix": bool(sometimes),
            "recommendation": recommendation}


def _static_graph(s: pd.DataFrame, n_steps: int, steps_word: str = "steps") -> tuple[bool, str]:
    if n_steps == 0:
        return False, "no step completed"
    rg_mask = s["requires_grad"].astype(bool).to_numpy()
    used_mask = rg_mask & s["used"].astype(bool).to_numpy()
    step_code, _ = pd.factorize(s["step"])
    name_code, _ = pd.factorize(s["name"])
    if _varies(step_code[rg_mask], name_code[rg_mask], step_code[rg_mask]):
        return False, "the set of tensors requiring grad changed between steps"
    if _varies(step_code[used_mask], name_code[used_mask], step_code):
        return False, "the set of tensors receiving gradients changed between steps"
    if n_steps == 1:
        return True, "one step observed: nothing contradicts a static graph (observe more steps)"
    return True, f"the same tensors received gradients on all {n_steps} observed {steps_word}"


def _varies(steps_at: np.ndarray, names_at: np.ndarray, compared: np.ndarray) -> bool:
    """Whether the set of names marked differs between any two of the steps in `compared`
    (step codes), on a step x tensor matrix: sets built per step with a groupby cost a tenth
    of a call's judging. A compared step with no mark counts as an empty set."""
    if not len(compared):
        return False
    n_names = int(names_at.max()) + 1 if len(names_at) else 0
    marked = np.zeros((int(compared.max()) + 1, n_names), dtype=bool)
    marked[steps_at, names_at] = True
    rows = marked[np.unique(compared)]
    return bool((rows.any(axis=0) != rows.all(axis=0)).any())
