"""The rank view of a report (`diagkit.present.ranks.rank_view`) on hand-built steps of
several ranks: which ranks used a tensor on which steps, where its values first diverged, the
same tensors as the rank verdicts, and a bounded table."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd

from diagkit.judge.rules_ranks import rank_dependent_use, rank_divergent
from diagkit.present.ranks import rank_view

HOSTILE = "<script>alert(1)</script>"


def rank_steps(spec: dict, n_steps: int = 3, n_ranks: int = 2) -> pd.DataFrame:
    """steps rows for every (step, rank, tensor); spec: name -> (used(step, rank),
    checksum(step, rank))."""
    rows = [{"step": s, "name": name, "rank": r, "used": bool(used(s, r)),
             "checksum": float(checksum(s, r)), "grad_norm": 1.0}
            for s in range(n_steps) for r in range(n_ranks)
            for name, (used, checksum) in spec.items()]
    return pd.DataFrame(rows)


def _body(out: str) -> list[str]:
    return out.split("<tbody>")[1].split("</tbody>")[0].split("</tr>")[:-1]


def test_rank_view_names_ranks_steps_and_first_divergence():
    steps = rank_steps({
        "enc.weight": (lambda s, r: True, lambda s, r: 1.0),                       # in sync
        "aux.weight": (lambda s, r: r == 1, lambda s, r: 2.0),                     # rank 1 only
        "scale": (lambda s, r: True, lambda s, r: 4.0 + (r if s >= 1 else 0)),     # from step 1
        HOSTILE: (lambda s, r: r == 0 and s != 1, lambda s, r: 1.0 + s * r),       # both
    })
    out = rank_view(steps)
    assert "2 ranks (0–1), 3 steps observed; 3 tensors differ between ranks" in out
    assert "(2 used on some ranks only, 2 with values that diverged)" in out
    rows = _body(out)
    assert len(rows) == 3 and "enc.weight" not in out
    # diverged first, earliest first (the hostile name after step 1, spread 2/3; scale step 1)
    hostile = html.escape(HOSTILE)
    assert hostile in rows[0] and "scale" in rows[1] and "aux.weight" in rows[2]
    assert HOSTILE not in out and "<script" not in out
    assert "rank 0: steps 0, 2; rank 1: never" in rows[0]
    assert "after step 1" in rows[0] and ">0.667<" in rows[0]
    assert "ranks 0–1: steps 0–2" in rows[1] and "after step 1" in rows[1]
    assert ">0.2<" in rows[1]  # (5 - 4) / 5
    assert "rank 1: steps 0–2; rank 0: never" in rows[2]
    assert rows[2].count("—") == 2  # never diverged: no step, no spread


def test_rank_view_agrees_with_the_rank_verdicts():
    steps = rank_steps({f"p{i}": (lambda s, r, i=i: r == 0 or i % 3 == 0,
                                  lambda s, r, i=i: i + (r * s if i % 4 == 0 else 0))
                        for i in range(24)}, n_steps=4, n_ranks=3)
    params = pd.DataFrame({"name": [f"p{i}" for i in range(24)]})
    expected = set(params["name"][rank_divergent(params, steps) | rank_dependent_use(params, steps)])
    out = rank_view(steps)
    shown = {name for name in params["name"] if f"<code>{name}</code>" in out}
    assert shown == expected and len(expected) == 18
    assert "3 ranks (0–2), 4 steps observed; 18 tensors differ" in out


def test_rank_view_nan_on_one_rank_counts_as_divergence():
    steps = rank_steps({"w": (lambda s, r: True, lambda s, r: np.nan if r == 1 and s == 2 else 1)})
    out = rank_view(steps)
    assert "after step 2" in out and ">inf<" in out


def test_rank_view_without_checksum_and_in_sync():
    steps = rank_steps({"w": (lambda s, r: True, lambda s, r: 1.0)})
    assert "no tensor differs between ranks" in rank_view(steps)
    assert "<table" not in rank_view(steps)
    out = rank_view(rank_steps({"w": (lambda s, r: s == r, lambda s, r: 0.0)})
                           .drop(columns="checksum"))
    assert "1 tensor differs between ranks" in out and "rank 0: step 0; rank 1: step 1" in out


def test_rank_view_is_bounded_at_2000_tensors():
    steps = rank_steps({f"layer.{i}.weight": (lambda s, r, i=i: r == 0 or i % 2 == 0,
                                              lambda s, r, i=i: 1.0 + (r * s * i if i % 5 == 0
                                                                       else 0))
                        for i in range(2000)}, n_steps=5)
    out = rank_view(steps)
    # odd: used on rank 0 only; non-zero multiples of 5: diverged after step 1
    flagged = sum(1 for i in range(2000) if i % 2 or (i % 5 == 0 and i))
    rows = _body(out)
    assert len(rows) == 50
    n = int(out.rsplit("and ", 1)[1].split(" more")[0])
    total = int(out.split("observed; ")[1].split(" tensors")[0])
    assert total == n + 50 == flagged == 1199 and len(out) < 30_000
    assert all('class="error"' in row for row in rows)  # diverged ones first
