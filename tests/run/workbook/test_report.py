"""`diagkit report` / `diagkit demo` end to end: papermill, offline HTML, a real Chromium.

The console script runs `demo` and the `--nproc` report in subprocesses; the other reports and
the bad inputs run the same CLI in this process (`run_cli`): their notebooks still run in real
papermill kernels. One rendered report is read by several Chromium checks."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from browser import SPLIT_PIECES, chromium, open_page
from cli_inprocess import run_cli
from widths import CLIPPED_CODE, SPLIT_UNITS

DIAGKIT = str(Path(sys.executable).parent / "diagkit")
needs_chromium = pytest.mark.skipif(chromium() is None, reason="chromium is not installed "
                                    "(make test installs it)")

HOSTILE = '''
import torch
from torch import nn

def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3))
    model.add_module("<script>alert(1)</script>", nn.Linear(3, 3))  # unused: gets a finding
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return {"model": model, "optimizer": opt,
            "batch_fn": lambda: torch.ones(2, 3),
            "loss_fn": lambda m, b: m[0](b).sum()}

def broken():
    raise ValueError("the builder broke")

def orphaned():
    setup = build()
    model = setup["model"]
    model.add_module("left_out", nn.Linear(3, 3))  # trained, in no optimizer: an orphan
    setup["loss_fn"] = lambda m, b: m.left_out(m[0](b)).sum()
    return setup
'''


def diagkit(*args, cwd=None):
    return subprocess.run([DIAGKIT, *args], capture_output=True, text=True, cwd=cwd, timeout=600)


def messages(stderr: str) -> list[str]:
    """What stderr says besides the progress bar (papermill's "Passed unknown parameter"
    warnings were here when the parameters cell used `str | None`, which papermill cannot
    read)."""
    return [part for part in re.split(r"[\r\n]", stderr)
            if part.strip() and not re.match(r"diagkit .*\d+%\|", part)]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "out" / "demo"  # parents created, as by make demo
    run = diagkit("demo", "--out", str(out), "--steps", "3")
    assert run.returncode == 0, run.stderr
    return out, run


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """One report (in this process) of a target with a hostile module name (an unused module)
    and an orphan (an error finding), with --show-code: read by the exit code and files test
    and by the escaping test in Chromium."""
    folder = tmp_path_factory.mktemp("hostile")
    (folder / "hostile.py").write_text(HOSTILE)
    out = folder / "report"
    run = run_cli("report", f"{folder / 'hostile.py'}:orphaned", "--out", str(out), "--steps",
                  "2", "--show-code", cwd=folder)
    return out, run


def test_demo_writes_one_report_and_says_where(demo):
    out, run = demo
    assert str((out / "report.html").resolve()) in run.stdout
    assert {"report.html", "report.ipynb"} <= {p.name for p in out.iterdir()}
    for name, worst in (("meta_memory", "error"), ("finetune_heads", "warning"),
                        ("clean", None)):  # the workbook, run headless by papermill on each
        assert {"params.csv", "steps.csv", "findings.json"} <= {p.name for p in (out / name).iterdir()}
        assert json.loads((out / name / "findings.json").read_text())["worst"] == worst, name
        assert (out / name / "params.csv").read_text().count("\n") > 1
    cells = json.loads((out / "report.ipynb").read_text())["cells"]
    outputs = [o for c in cells for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    # each demo's gradient norms, update ratios and wiring matrix
    assert len([o for o in outputs if "image/png" in o.get("data", {})]) >= 9
    assert "diagkit diagkit.demos:meta_memory" in run.stderr  # progress was shown
    assert not list(out.parent.glob(".report.tmp-*"))  # scratch folders cleaned up
    assert "DuplicateCellId" not in run.stderr  # three runs of one notebook, merged
    assert messages(run.stderr) == []  # a clean run says nothing but its progress


def test_demo_notebook_cell_ids_are_unique(demo):
    out, _ = demo
    ids = [c["id"] for c in json.loads((out / "report.ipynb").read_text())["cells"]]
    assert len(ids) == len(set(ids)) and len(ids) > 30


def test_report_html_is_self_contained(demo):
    html = re.sub(r"<wbr/?>", "", (demo[0] / "report.html").read_text())  # names wrap at dots
    assert html.lstrip().lower().startswith("<!doctype html>")
    for name in ("module.metamodel.model.mem_tokens", "encoder.readout_atom.weight",
                 "cmim_decoder.0.weight", "hidden.weight", "diagkit.demos:finetune_heads"):
        assert name in html
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", html, re.I)
    assert "@import" not in html
    assert "hl-ipython3" not in html  # code hidden by default


def test_report_command_exit_codes_and_files(hostile):
    """Exit 1 for an error finding (exit 0 for a clean report: the --nproc and checkpoint
    reports below), the tables beside the HTML, and --show-code."""
    out, run = hostile
    assert run.returncode == 1, run.stderr  # an orphan is an error finding
    assert str((out / "report.html").resolve()) in run.stdout
    assert messages(run.stderr) == []  # --steps and out_dir are passed: no papermill warning
    names = {p.name for p in out.iterdir()}
    assert {"report.html", "report.ipynb", "params.csv", "steps.csv", "findings.json"} <= names
    findings = json.loads((out / "findings.json").read_text())
    assert findings["worst"] == "error"
    assert any(f["code"] == "orphan" and "left_out" in f["module"]
               for f in findings["findings"])
    html = (out / "report.html").read_text()
    assert "hl-ipython3" in html and "check_parameters" in html


def test_a_failing_cell_still_writes_the_report_and_fails(tmp_path):
    (tmp_path / "hostile.py").write_text(HOSTILE)
    out = tmp_path / "r"
    run = run_cli("report", f"{tmp_path / 'hostile.py'}:broken", "--out", str(out),
                  cwd=tmp_path)
    assert run.returncode == 2
    (last,) = messages(run.stderr)  # the promised one line, nothing else
    assert last.startswith("diagkit: error: report incomplete") and "the builder broke" in last
    html = (out / "report.html").read_text()
    assert "This report is incomplete" in html and "the builder broke" in html
    # the notebook's cell shows the one line too, not a traceback through diagkit's code
    text = re.sub(r"\x1b\[[0-9;]*m", "", re.sub(r"<[^>]+>", "", html))
    assert "Traceback" not in text and "workbook.py" not in text and "api.py" not in text


@pytest.mark.parametrize("args, words", [
    (["report", "no.such.module:f", "--out", "OUT"], ["no module named 'no.such.module'"]),
    (["report", "diagkit.demos:clean", "--out", "OUT", "--arg", "bogus=1"], ["bogus"]),
    (["report", "diagkit.demos:clean"], ["--out"]),
    (["report", "diagkit.demos:clean", "--out", "OUT", "--checkpoint", "missing.pt"],
     ["missing.pt"]),
])
def test_report_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, words):
    args = [a.replace("OUT", str(tmp_path / "out")) for a in args]
    run = run_cli(*args, cwd=tmp_path)  # refused before a kernel starts: no subprocess
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("diagkit: error:"), run.stderr
    for word in words:
        assert word in lines[0]
    assert not (tmp_path / "out").exists()


@needs_chromium
def test_demo_report_in_chromium(demo, tmp_path):
    shot = tmp_path / "demo.png"
    dom, requests = open_page((demo[0] / "report.html").resolve().as_uri(), screenshot=str(shot))
    assert requests == []  # the page made no network request at all
    assert shot.stat().st_size > 10_000
    # The banner, the findings with the orphan and the dead weight, the figures, the table.
    assert "orphan" in dom and "mem_tokens" in dom and "grad_not_cleared" in dom
    assert "cmim_decoder" in dom and "unused" in dom
    assert "find_unused_parameters" in dom
    assert dom.count("<img") >= 9  # three figures for each of the three demos
    assert dom.count("<table") >= 6


@needs_chromium
def test_hostile_names_are_escaped_in_chromium(hostile):
    out, _ = hostile
    html = (out / "report.html").read_text()
    assert "<script>alert(1)</script>" not in html
    dom, requests = open_page((out / "report.html").resolve().as_uri())
    assert requests == []
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom  # shown as text, escaped
    assert "<script>alert" not in dom


def test_a_dying_kernel_still_writes_the_report_and_fails(tmp_path):
    (tmp_path / "dies.py").write_text(HOSTILE + '''

def dies():
    import os
    setup = build()
    def train_step(i):
        os._exit(3)  # the kernel process dies mid-run
    return {"model": setup["model"], "optimizer": setup["optimizer"], "train_step": train_step}
''')
    out = tmp_path / "r"
    run = run_cli("report", f"{tmp_path / 'dies.py'}:dies", "--out", str(out), cwd=tmp_path)
    assert run.returncode == 2
    assert "report incomplete" in run.stderr.strip().splitlines()[-1]
    assert "This report is incomplete" in (out / "report.html").read_text()


def test_report_with_nproc_2_shows_the_per_rank_view(tmp_path):
    out = tmp_path / "ranks"
    run = diagkit("report", "diagkit.demos:rank_branch", "--nproc", "2", "--steps", "3",
                  "--out", str(out))
    assert run.returncode == 0, run.stderr  # rank-dependent use is a warning
    html = (out / "report.html").read_text().replace("\u00a0", " ")  # (units on one line)
    assert "2 ranks (0–1), 3 steps observed" in html
    assert "module.aux.weight" in html and "rank 0: never" in html
    assert "<h2" in html and ">Per rank" in html  # a section with something to show keeps it
    steps = (out / "steps.csv").read_text().splitlines()
    assert steps[0].startswith("rank,step,name,") and steps[0].endswith(",checksum")


@pytest.fixture(scope="module")
def checkpoint_report(tmp_path_factory):
    """A one-target report with the default options (code hidden), a checkpoint loaded."""
    ckpt = Path(__file__).resolve().parents[3] / "data" / "finetune_heads_pretrain.pt"
    out = tmp_path_factory.mktemp("ckpt") / "ft"
    run = run_cli("report", "diagkit.demos:finetune_heads", "--checkpoint", str(ckpt),
                  "--steps", "2", "--out", str(out))
    return out, run


def test_report_with_a_checkpoint_shows_the_load_report_and_dead_bytes(checkpoint_report):
    out, run = checkpoint_report
    assert run.returncode == 0, run.stderr
    html = (out / "report.html").read_text().replace("\u00a0", " ")  # (units on one line)
    assert "19 tensors loaded" in html and "4 missing from the file" in html
    assert "dead_weight_in_checkpoint" in html and "18.6 KiB" in html


def measured_in_chromium(report: Path, tmp_path: Path, script: str):
    """Open `report` in headless Chromium with `script` (which lays out the page and writes
    its findings as JSON into <pre id="out">) run at the end of its body; return that JSON.
    The report's Content-Security-Policy (no scripts) is taken off for this copy only."""
    page = tmp_path / "measured.html"
    text = re.sub(r'<meta[^>]*Content-Security-Policy[^>]*>', "", report.read_text())
    page.write_text(text.replace("</body>", script + "</body>"))
    dom, _ = open_page(page.as_uri())
    found = re.search(r'<pre id="out">(.*?)</pre>', dom, re.S).group(1)
    return json.loads(found.replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                      .replace("&amp;", "&"))


WRITE_OUT = """
  const pre = document.createElement('pre');
  pre.id = 'out';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""

# One page load measures it all: each width set is laid out again when a box is asked for.
MEASURE = """<script>
(() => {  // at the end of the body: everything above is laid out when asked
  const splits = """ + SPLIT_PIECES + """;
  const clipped = """ + CLIPPED_CODE + """;
  const units = """ + SPLIT_UNITS + """;
  document.body.style.margin = '0';
  const out = {splits: {}, clipped: {}, units: {}, height: {}};
  for (const width of WIDTHS) {
    document.body.style.width = width + 'px';
    if (width === 968) {  // JupyterLab's output area
      out.tables = [...document.querySelectorAll('table')].map(t => [
        t.className || t.id, Math.round(t.getBoundingClientRect().width)]);
    }
    // every table cell's pieces: does one run across a line break where none may?
    out.splits[width] = splits(document);
    out.clipped[width] = clipped(document.body);
    out.units[width] = units(document.body);
    out.height[width] = document.documentElement.scrollHeight;
  }
  // code in the code font (the lab CSS gives an output's <pre> the text font)
  out.textfont = [...document.querySelectorAll('.jp-OutputArea-output pre')]
    .filter(p => !/mono/i.test(getComputedStyle(p).fontFamily))
    .map(p => p.textContent.slice(0, 40));""" + WRITE_OUT
WIDTHS = (968, 1400)


@pytest.fixture(scope="module")
def measured(demo, tmp_path_factory):
    """The demo report laid out in one headless Chromium at each of WIDTHS."""
    return measured_in_chromium(demo[0] / "report.html", tmp_path_factory.mktemp("measured"),
                                MEASURE.replace("WIDTHS", json.dumps(list(WIDTHS))))


@needs_chromium
def test_wide_tables_fit_the_output_area(measured):
    """At JupyterLab's 968 px output width the findings and wiring tables wrap long names
    and fixes instead of running off the side (issue: 1124 px and 1536 px)."""
    assert len(measured["tables"]) >= 6
    too_wide = [(name, width) for name, width in measured["tables"] if width > 968]
    assert not too_wide


@needs_chromium
@pytest.mark.parametrize("width", WIDTHS)
def test_no_table_cell_splits_a_number_or_an_identifier(measured, width):
    """Measured in Chromium: every number, header and identifier in the report's tables stays
    on one line (a name may wrap after a dot); the tables still fit (the test above)."""
    split = measured["splits"][str(width)]
    assert split == [], split[:40]


@needs_chromium
@pytest.mark.parametrize("width", WIDTHS)
def test_code_is_readable_without_scrolling_and_numbers_keep_their_units(measured, width):
    """Each fix's code and the lines that built the group get the table's whole width and
    wrap (issue 37: at 968 px, 106 px scroll boxes held 240-600 px of code; at 1400 px the
    source line with the name filter was cut); '8.0 KiB' and '3 steps' never split."""
    assert measured["clipped"][str(width)] == []
    assert measured["units"][str(width)] == []
    assert measured["textfont"] == []  # indented source lines in the code font


FOLDED = ("Over the run", "Fix preview", "Per rank", "Checkpoint", "Explore",
          "What the target printed")


def test_the_report_says_what_it_is_and_folds_what_is_empty(demo, hostile):
    """The notebook's instructions stay in the notebook; each target is named with when it
    ran and its worst severity; the sections with nothing to show take one line together
    (the demo report was 13,000 px tall, each of these a heading and an empty frame, three
    times). report.ipynb keeps every cell."""
    for out, targets in ((demo[0], 3), (hostile[0], 1)):  # (with its code shown, too)
        page = (out / "report.html").read_text()
        text = re.sub(r"<[^>]+>", " ", page).replace("\u00a0", " ")
        assert "Edit the parameters" not in text and "The next cell is" not in text
        assert "then run all" not in text
        assert page.count('class="diagkit-header"') == targets
        assert len(re.findall(r"run 20\d\d-\d\d-\d\d \d\d:\d\d", text)) == targets
        for heading in FOLDED:
            assert not re.search(rf"<h[1-3][^>]*>{heading}", page), heading
        folded = re.findall(r"Nothing to show: (.*?)\.\s", text)
        assert len(folded) == targets
        for line in folded:
            assert [h for h in FOLDED if h in line] == list(FOLDED), line
        assert "Edit the parameters" in (out / "report.ipynb").read_text()
    demo_text = re.sub(r"<[^>]+>", "", (demo[0] / "report.html").read_text())
    assert "diagkit.demos:meta_memory: worst error, 3 steps observed" in demo_text
    assert "diagkit.demos:clean: no findings, 3 steps observed" in demo_text


@needs_chromium
def test_the_first_screen_names_the_target_when_and_the_worst(checkpoint_report, tmp_path):
    """Laid out at 1400 x 1000 px, the first screen of a one-target report shows the target,
    when it ran and its worst severity (it was only in <title>), above the findings."""
    found = measured_in_chromium(checkpoint_report[0] / "report.html", tmp_path, """<script>
(() => {
  const out = {};
  document.body.style.width = '1400px';
  const header = document.querySelector('.diagkit-header');
  const findings = document.querySelector('table.diagkit-findings');
  out.header = header && [header.getBoundingClientRect().bottom, header.textContent];
  out.findings = findings && findings.getBoundingClientRect().top;""" + WRITE_OUT)
    assert found["header"], "no header names the target"
    bottom, text = found["header"]
    assert bottom < 1000 and found["findings"] < 1000, found
    assert "diagkit.demos:finetune_heads" in text
    assert "worst: warning" in text.replace("\u00a0", " ")
    assert re.search(r"run 20\d\d-\d\d-\d\d", text)
