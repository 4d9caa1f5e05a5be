"""A lever written in a notebook cell is named by the cell: an optimizer built in a
`configure_optimizers` defined in cell [1] makes the orphan's fix say "(cell [1], line 3)", not
the shell's file name for the cell. A real IPython shell runs the cells."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
CELLS = [f"""import sys
def configure_optimizers(m):
    return torch.optim.SGD(m.fc1.parameters(), lr=0.1)
sys.path.insert(0, {str(HELPERS)!r})""",
         """import torch, diagkit
from models import MLP, fixed_batch, mse_loss
from diagkit.measure.origin.provenance import record_optimizer_sources, sources_for
m = MLP()
with record_optimizer_sources() as recorder:
    opt = configure_optimizers(m)
setup = diagkit.Setup(m, optimizer=opt, batch_fn=fixed_batch, loss_fn=mse_loss, steps=2)
setup.optimizer_sources = sources_for(recorder, [opt])
orphan = next(f for f in diagkit.diagnose(setup).findings if f.code == "orphan")"""]
DRIVER = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
for cell in json.loads(sys.stdin.read()):
    result = shell.run_cell(cell, store_history=True)
    if not result.success:
        raise SystemExit(f"cell failed: {result.error_in_exec or result.error_before_exec!r}")
orphan = shell.user_ns["orphan"]
print(json.dumps({"fix": orphan.fix, "source": list(orphan.source)}))
"""


def test_a_hook_in_a_notebook_cell_is_named_by_the_cell():
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(DRIVER)],
                          input=json.dumps(CELLS), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["fix"].startswith("Put it in the optimizer your `configure_optimizers` builds "
                                 "(cell [1], line 3): include list(self.fc2.parameters()) in "
                                 "the params it passes."), got["fix"]
    (source,) = got["source"]
    assert source["cell"] == 1 and source["line"] == 3 and "ipython-input" in source["file"]
