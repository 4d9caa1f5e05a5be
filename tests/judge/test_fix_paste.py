"""A fix pastes and runs (issue 37, item 3): in a real IPython shell, the cells of the JupyterLab
live test (tests/e2e/test_jupyterlab_live.py: `TwoHeads`, SGD over `two_heads_groups(...,
planted=True)`, head2 an orphan, the training block of docs/workbook.md) run; the first code
block of the orphan's fix is run as the next cell, as it is; the same training cell then
watches again, and the second diagnosis has no finding. With the user's names `m` and `opt`
(no `model`, no `optimizer` anywhere) the fix says `m` and `opt`. The source of the groups is
"cell [1], line k", not the shell's file name for the cell."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from doc_blocks import DOCS, snippet
from models import two_heads_cell

TESTS = Path(__file__).resolve().parents[1]
TRAIN = snippet(DOCS / "workbook.md", "diagkit.watch(", section="## The live view")
STEPS = int(re.search(r"steps=(\d+)", TRAIN).group(1))
SETUP = two_heads_cell(STEPS)

# The shell runs each cell as a notebook would (store_history: the cell gets its number), and
# prints what the test reads, as JSON, on its last line.
DRIVER = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
cells = json.loads(sys.stdin.read())

def run(cell):
    result = shell.run_cell(cell, store_history=True)
    if not result.success:
        raise SystemExit(f"cell failed: {result.error_in_exec or result.error_before_exec!r}")

run(cells["setup"])
run(cells["train"])
from diagkit.core import fixtext
from diagkit.present.source import source_text
first = shell.user_ns["w"].diagnosis
orphan = next(f for f in first.findings if f.code == "orphan")
pasted = fixtext.first_code(orphan.fix)
run(pasted)                                   # the next cell: the fix, as it is
run(cells["again"])                           # a new loader, then the same training cell
run(cells["train"])
second = shell.user_ns["w"].diagnosis
print(json.dumps({"first": [f.code for f in first.findings], "fix": orphan.fix,
                  "pasted": pasted, "source": source_text(orphan.source, ""),
                  "second": [f"{f.code}: {f.message}" for f in second.findings],
                  "names": first.meta.get("names")}))
"""


def renamed(code: str, names: dict) -> str:
    for old, new in names.items():
        code = re.sub(rf"\b{old}\b", new, code)
    return code


def paste_and_watch_again(names: dict) -> dict:
    """Run the cells in a new interpreter's IPython shell, with `model` and `optimizer`
    renamed as `names` says."""
    cells = {"setup": renamed(SETUP, names), "train": renamed(TRAIN, names),
             "again": f"loader = batches({STEPS} + 10)"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(DRIVER)],
                          input=json.dumps(cells), capture_output=True, text=True, timeout=300,
                          cwd=TESTS)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("names", [{}, {"model": "m", "optimizer": "opt"}],
                         ids=["model-optimizer", "m-opt"])
def test_the_orphans_fix_pasted_as_the_next_cell_makes_the_next_watch_clean(names):
    got = paste_and_watch_again(names)
    model, opt = names.get("model", "model"), names.get("optimizer", "optimizer")
    assert got["first"] == ["orphan", "grad_not_cleared"]
    # the user's own names, each tensor in the group of its kind: no weight decay on the bias
    assert got["pasted"] == (f'{opt}.param_groups[0]["params"].append({model}.head2.weight)\n'
                             f'{opt}.param_groups[1]["params"].append({model}.head2.bias)')
    assert got["names"] == {"model": model, "optimizers": [opt]}
    assert got["second"] == []
    # where the groups were built: the cell and its line, not the shell's name for the cell
    assert got["source"][0].endswith("built at (found from the watch(...) call) cell [1], "
                                     "line 8:"), got["source"]
    assert "ipython-input" not in "".join(got["source"])
