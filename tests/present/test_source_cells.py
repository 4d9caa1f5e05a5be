"""Where an optimizer group was built, in a notebook: "cell [n], line k", in the text and in the
HTML, never the kernel's temporary file (`/tmp/ipykernel_NNNN/142462611.py`, gone when the
kernel ends). A real Jupyter kernel (ipykernel, through jupyter_client) runs the cells: the
optimizer is built in cell [1], watched in cell [2]."""

from __future__ import annotations

import json
from pathlib import Path

from jupyter_client.manager import start_new_kernel

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
CELLS = [f"""import sys, json
sys.path.insert(0, {str(HELPERS)!r})
import torch, diagkit
from models import TwoHeads, two_heads_groups
torch.manual_seed(0)
model = TwoHeads()
optimizer = torch.optim.SGD(two_heads_groups(dict(model.named_parameters()), planted=True),
                            lr=0.05)""",
         """w = diagkit.watch(model, optimizer, steps=3, live=False)
for _ in range(4):
    optimizer.zero_grad(); model(torch.randn(4, 8)).backward(); optimizer.step()""",
         """from diagkit.present.source import source_html, source_text
orphan = next(f for f in w.diagnosis.findings if f.code == "orphan")
print(json.dumps({"text": source_text(orphan.source, ""), "html": source_html(orphan.source),
                  "records": list(orphan.source)}))"""]


def run_in_kernel(cells: list[str]) -> str:
    """Each cell executed in order in a new kernel (its execution count its number); the
    printed output of the last."""
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        printed = []
        for cell in cells:
            printed.clear()
            reply = client.execute_interactive(
                cell, timeout=240, output_hook=lambda msg: printed.append(
                    msg["content"].get("text", "") if msg["msg_type"] == "stream"
                    else json.dumps(msg["content"]) if msg["msg_type"] == "error" else ""))
            assert reply["content"]["status"] == "ok", "".join(printed)
        return "".join(printed)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_a_notebook_cell_is_named_by_its_number_and_line():
    got = json.loads(run_in_kernel(CELLS).strip().splitlines()[-1])
    first = got["records"][0]
    assert "ipykernel_" in first["file"] and first["cell"] == 1  # the kernel's file, recorded
    assert got["text"][0] == ("optimizer 0 group 0 (SGD), built at (found from the watch(...) "
                              "call) cell [1], line 7:")
    assert got["text"][1].startswith("  | optimizer = torch.optim.SGD(two_heads_groups(")
    assert "built at (found from the watch(...) call) cell [1], line 7</div>" in got["html"]
    assert "ipykernel_" not in "".join(got["text"]) + got["html"]
