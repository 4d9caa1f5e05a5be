"""A private JupyterLab and the explorer in its page, driven over CDP: what the JupyterLab tests
share (tests/e2e/test_jupyterlab.py, tests/e2e/test_jupyterlab_live.py).

`JupyterLab`: `jupyter lab` on loopback with a token and temporary notebook, config, data and
runtime folders (nothing of the user's is read or written), always ended with its kernels.
`Page`: the explorer's controls acted on as a user would, each state checked for layout
problems and browser errors.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

JUPYTER = str(Path(sys.executable).parent / "jupyter")

# The controls a user changes, by the CSS class the explorer gives each, and the element in it
# that takes the click or the keys.
CONTROLS = {"verdicts": "select", "module": "input", "regex": "input", "metric": "select",
            "log": "input", "tensors": "select"}


# ---------------------------------------------------------------------- the server
class JupyterLab:
    """`jupyter lab` on a free loopback port with a random token and private folders; always
    ended (and its kernels with it) on exit."""

    def __init__(self, notebooks: Path, home: Path):
        self.notebooks, self.home = notebooks, home
        self.token = secrets.token_hex(16)
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def __enter__(self) -> "JupyterLab":
        env = {**os.environ, "JUPYTER_CONFIG_DIR": str(self.home / "config"),
               "JUPYTER_DATA_DIR": str(self.home / "data"),
               "JUPYTER_RUNTIME_DIR": str(self.home / "runtime"),
               "IPYTHONDIR": str(self.home / "ipython"), "JUPYTER_PLATFORM_DIRS": "1",
               "MPLBACKEND": "agg"}
        _quiet_settings(self.home / "config")
        self.log = open(self.home / "server.log", "w")
        self.proc = subprocess.Popen(
            [JUPYTER, "lab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
             f"--port={self.port}", "--port-retries=0", f"--IdentityProvider.token={self.token}",
             f"--ServerApp.root_dir={self.notebooks}", "--LabApp.expose_app_in_browser=True",
             "--LabApp.news_url="],
            env=env, cwd=self.notebooks, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait(lambda: self._answers(), 120, "jupyter lab did not answer", self)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited: {self.tail()}")
        try:
            with urllib.request.urlopen(self.url("api/status"), timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def tail(self) -> str:
        self.log.flush()
        return (self.home / "server.log").read_text()[-3000:]

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()        # jupyter shuts its kernels down on SIGTERM
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self.log.close()


def _quiet_settings(config: Path) -> None:
    """User settings (in the temporary config folder) that keep JupyterLab from asking about
    news or update checks, which would put a toast over the page."""
    folder = config / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notification.jupyterlab-settings").write_text(json.dumps(
        {"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(probe, timeout: float, message: str, lab: JupyterLab | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(message + (f"\nserver log:\n{lab.tail()}" if lab else ""))


# ---------------------------------------------------------------------- the page
NOTEBOOK_PANEL = ("Array.from(window.jupyterapp.shell.widgets('main'))"
                  ".find(w => w.sessionContext)")
KERNEL_IDLE = f"""(() => {{
  const w = window.jupyterapp && {NOTEBOOK_PANEL};
  const k = w && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!(k && k.connectionStatus === 'connected'
            && w.sessionContext.kernelDisplayStatus === 'idle');
}})()"""
RUN_ALL = f"""(() => {{
  const w = {NOTEBOOK_PANEL};
  window.jupyterapp.shell.activateById(w.id);
  return window.jupyterapp.commands.execute('notebook:run-all-cells').then(() => true);
}})()"""
# Run every cell without waiting for them: the command's promise settles when they have run.
START_ALL = f"""(() => {{ const w = {NOTEBOOK_PANEL};
  window.jupyterapp.shell.activateById(w.id);
  window.jupyterapp.commands.execute('notebook:run-all-cells');
  return true; }})()"""
SAVE = f"""(() => {{
  const w = {NOTEBOOK_PANEL};
  return w.context.save().then(() => !w.model.dirty);
}})()"""
EXPLORER_SHOWN = """(() => {
  const img = document.querySelector('.diagkit-explorer .diagkit-explorer-plot img');
  return !!(img && img.complete && img.naturalWidth > 0);
})()"""
CELL_ERRORS = """Array.from(document.querySelectorAll(
  '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"],'
  + '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.error"]'))
  .map(e => e.textContent.slice(0, 500))"""
# What a redraw changes: the plot (its image, a new data URL per figure, and its alt text:
# their hash here, so that a poll does not carry the whole image) and the table's HTML.
SNAPSHOT = """(() => {
  const ex = document.querySelector('.diagkit-explorer');
  const img = ex.querySelector('.diagkit-explorer-plot img');
  const src = img.src + img.alt;
  let hash = 2166136261;
  for (let i = 0; i < src.length; i++) hash = Math.imul(hash ^ src.charCodeAt(i), 16777619);
  return {plot: `${src.length}:${hash >>> 0}`,
          table: ex.querySelector('.diagkit-explorer-table').innerHTML,
          status: ex.querySelector('.diagkit-explorer-status').textContent};
})()"""

# Every control: its box inside the explorer (and the explorer inside its output area), and on
# top at its left end, centre and right end (document.elementFromPoint), each label whole, every
# option of the tensor picker wide enough for its text, the table no wider than the explorer.
LAYOUT_PROBLEMS = """((controls) => {
  const ex = document.querySelector('.diagkit-explorer');
  const problems = [];
  const inside = (r, b) => r.left >= b.left - 0.5 && r.right <= b.right + 0.5
                           && r.top >= b.top - 0.5 && r.bottom <= b.bottom + 0.5;
  const onTop = (name, el, r) => {
    const y = (r.top + r.bottom) / 2;
    for (const x of [r.left + 2, (r.left + r.right) / 2, r.right - 2]) {
      const hit = document.elementFromPoint(x, y);
      if (!hit || !(hit === el || el.contains(hit)))
        problems.push(`${name}: covered at x=${Math.round(x)} by `
                      + (hit ? hit.outerHTML.slice(0, 100) : 'nothing'));
    }
  };
  const area = ex.closest('.jp-OutputArea-output') || ex.parentElement;
  if (!inside(ex.getBoundingClientRect(), area.getBoundingClientRect()))
    problems.push('the explorer is wider than its output area');
  for (const [name, tag] of Object.entries(controls)) {
    const w = ex.querySelector('.diagkit-explorer-' + name);
    const el = w && w.querySelector(tag);
    if (!el) { problems.push(`${name}: not found`); continue; }
    el.scrollIntoView({block: 'center', inline: 'nearest'});
    const r = el.getBoundingClientRect();
    if (r.width < 8 || r.height < 8) problems.push(`${name}: ${r.width}x${r.height} px`);
    if (!inside(r, ex.getBoundingClientRect())) problems.push(`${name}: outside the explorer`);
    onTop(name, el, r);
    // a checkbox's own text is in .widget-label-basic; its .widget-label is hidden (no indent)
    const label = w.querySelector('.widget-label-basic span') || w.querySelector('.widget-label');
    if (!label || !label.textContent.trim()) { problems.push(`${name}: no label`); continue; }
    if (label.scrollWidth > label.clientWidth + 1)
      problems.push(`${name}: label cut (${label.textContent}: ${label.clientWidth} of `
                    + `${label.scrollWidth} px)`);
    onTop(name + ' label', label, label.getBoundingClientRect());
  }
  const picker = ex.querySelector('.diagkit-explorer-tensors select');
  if (picker) {
    const cs = getComputedStyle(picker);
    const ctx = document.createElement('canvas').getContext('2d');
    ctx.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
    const room = picker.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight) - 6;
    for (const o of picker.options)
      if (ctx.measureText(o.text).width > room) problems.push(`tensors: option cut: ${o.text}`);
  }
  const table = ex.querySelector('.diagkit-explorer-table table');
  if (table && table.getBoundingClientRect().right > ex.getBoundingClientRect().right + 0.5)
    problems.push(`table: ${Math.round(table.getBoundingClientRect().width)} px wide, the `
                  + `explorer ${Math.round(ex.getBoundingClientRect().width)} px`);
  // every fact of the table (a number, a shape: one unbreakable span each) whole in its box
  const rows = ex.querySelector('.diagkit-explorer-rows');
  for (const span of ex.querySelectorAll('.diagkit-explorer-table td span')) {
    const r = span.getBoundingClientRect();
    if (rows && r.width && r.right > rows.getBoundingClientRect().right + 0.5)
      problems.push(`table: ${span.textContent} cut at the edge`);
  }
  // code (a fix, the lines that built a group): every line whole, no box to scroll sideways
  for (const pre of ex.querySelectorAll('.diagkit-explorer-findings pre')) {
    if (!pre.getClientRects().length) continue;       // folded away
    if (pre.scrollWidth > pre.clientWidth + 1)
      problems.push(`code cut: ${pre.textContent.slice(0, 60)} (${pre.clientWidth} of `
                    + `${pre.scrollWidth} px)`);
    if (!inside(pre.getBoundingClientRect(), ex.getBoundingClientRect()))
      problems.push(`code outside the explorer: ${pre.textContent.slice(0, 60)}`);
  }
  for (const img of ex.querySelectorAll('img'))
    if (!img.alt || img.alt.length < 20) problems.push(`an image without alt text: ${img.alt}`);
  return problems;
})"""
# The notebook around the explorer: which cell is active, how many there are.
NOTEBOOK_STATE = f"""(() => {{ const w = {NOTEBOOK_PANEL};
  return {{active: w.content.activeCellIndex, cells: w.content.widgets.length}}; }})()"""


class Page:
    """The explorer in the page: find its controls, act on them as a user, check it."""

    def __init__(self, browser, shots: Path):
        self.b, self.shots = browser, shots
        self.problems: list[str] = []
        self.n = 0
        self.errors_seen = 0     # browser errors already reported, each at the step it came in

    def centre(self, js: str) -> tuple[float, float]:
        """Scroll the element `js` evaluates to into view; its centre."""
        r = self.b.evaluate(f"""(() => {{ const e = {js}; e.scrollIntoView({{block: 'center'}});
            const r = e.getBoundingClientRect();
            return [(r.left + r.right) / 2, (r.top + r.bottom) / 2]; }})()""")
        return r[0], r[1]

    def control(self, name: str) -> str:
        return f"document.querySelector('.diagkit-explorer-{name} {CONTROLS[name]}')"

    def option(self, name: str, text: str) -> str:
        return (f"Array.from({self.control(name)}.options)"
                f".find(o => o.text.replace(/\u00a0/g, ' ').startsWith({json.dumps(text)}))")

    def change(self, step: str, act, status: str | None = None, table: bool = True,
               plot: bool = True) -> None:
        """Do `act`, then wait for the plot (unless `plot` is False) and the table (unless
        `table` is False) to redraw and the status line to contain `status`; then check the
        layout, take a screenshot."""
        before = self.b.evaluate(SNAPSHOT)
        act()
        checks = {}
        if plot:
            checks["a new plot"] = f"s.plot !== {json.dumps(before['plot'])}"
        if table:
            checks["a new table"] = f"s.table !== {json.dumps(before['table'])}"
        if status:
            checks[f"status {status!r}"] = f"s.status.includes({json.dumps(status)})"
        self.b.wait_for(f"(() => {{ const s = {SNAPSHOT}; return {' && '.join(checks.values())};"
                        " })()", timeout=60, what=f"{step}: {', '.join(checks)}")
        self.check(step)

    def check(self, step: str) -> None:
        """Record every layout problem and browser error of this state; take a screenshot.
        Problems are collected, not raised, so that one run shows all of them."""
        self.n += 1
        for problem in self.b.evaluate(f"{LAYOUT_PROBLEMS}({json.dumps(CONTROLS)})"):
            self.problems.append(f"{step}: {problem}")
        self.b.evaluate("document.querySelector('.diagkit-explorer').scrollIntoView()")
        self.b.screenshot(self.shots / f"{self.n:02d}-{step}.png")
        errors = self.b.errors
        self.problems += [f"{step}: {e}" for e in errors[self.errors_seen:]]
        self.errors_seen = len(errors)

    # -------------------------------------------------------------- a user's actions
    def pick(self, name: str, text: str, ctrl: bool = False) -> None:
        self.b.click(*self.centre(self.option(name, text)), ctrl=ctrl)

    def picked(self) -> list[str]:
        """The tensors the picker shows selected (names, without their verdicts)."""
        return self.b.evaluate(f"Array.from({self.control('tensors')}.selectedOptions)"
                               ".map(o => o.text.replace(/\u00a0/g, ' ').split('  [')[0])")

    def width(self, pixels: int, height: int = 900) -> None:
        """Make the window `pixels` wide (JupyterLab lays itself out again)."""
        self.b.send("Emulation.setDeviceMetricsOverride", width=pixels, height=height,
                    deviceScaleFactor=1, mobile=False)
        self.b.evaluate("new Promise(r => setTimeout(r, 800)).then(() => true)")

    def key(self, char: str) -> None:
        """Type one letter as a key press (keydown, char, keyup), as a keyboard would: what
        JupyterLab's shortcuts read (an inserted text is no key press)."""
        code = ord(char.upper())
        for kind in ("keyDown", "keyUp"):
            self.b.send("Input.dispatchKeyEvent", type=kind, key=char, code=f"Key{char.upper()}",
                        windowsVirtualKeyCode=code, nativeVirtualKeyCode=code,
                        **({"text": char} if kind == "keyDown" else {}))

    def type_into(self, name: str, text: str, enter: bool = False) -> None:
        self.b.click(*self.centre(self.control(name)))
        self.b.clear_field()
        if text:
            self.b.type_text(text)
        if enter:
            self.b.press("Enter")


