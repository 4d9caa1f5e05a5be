"""A self-contained HTML report: inline CSS and images, no script, no network request.

Names of parameters and modules are user data and are always escaped.
"""

from __future__ import annotations

import base64
import html
import io
import os
import tempfile
from pathlib import Path

from .findings import human_bytes
from .plots import grad_norm_figure

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em}
.banner span{display:inline-block;margin:.2em;padding:.3em .6em;border-radius:4px;background:#eee}
.error{background:#fdd!important}.warning{background:#ffe7b3!important}.info{background:#e3efff!important}
table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ddd;padding:.25em .5em;text-align:left}
code{background:#f5f5f5;padding:.1em .3em;white-space:pre-wrap}
"""


def _figure_img(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="gradient norms" src="data:image/png;base64,{data}">'


def render_section(title: str, diag) -> str:
    esc = html.escape
    params = diag.params
    counts: dict[str, list[int]] = {}
    for verdicts, size in zip(params["verdicts"], params["bytes"]):
        for v in verdicts:
            c = counts.setdefault(v, [0, 0])
            c[0] += 1
            c[1] += int(size)
    sev = {f.code: f.severity for f in diag.findings}
    banner = "".join(
        f'<span class="{esc(sev.get(v, "ok"))}"><b>{esc(v)}</b> {n} tensors, {human_bytes(b)}</span>'
        for v, (n, b) in sorted(counts.items(), key=lambda kv: -kv[1][1]))
    findings = "".join(
        f'<tr class="{esc(f.severity)}"><td>{esc(f.severity)}</td><td>{esc(f.code)}</td>'
        f"<td>{esc(f.module)}</td><td>{f.count}</td><td>{human_bytes(f.bytes)}</td>"
        f"<td>{esc(f.message)}<br><code>{esc(f.fix)}</code></td></tr>" for f in diag.findings)
    cols = ["name", "verdicts", "requires_grad", "optimizer", "group", "lr", "weight_decay",
            "used_steps", "changed_steps", "grad_norm", "grad_total_norm", "delta_norm", "bytes"]
    table = params[cols].assign(verdicts=params["verdicts"].map(", ".join)).to_html(
        index=False, escape=True, na_rep="", float_format=lambda x: f"{x:.3g}")
    fup = diag.advice["find_unused_parameters"]
    sg = diag.advice["static_graph"]
    advice = (f"<p><b>find_unused_parameters={esc(str(fup['value']))}</b>: {esc(fup['evidence'])}; "
              f"{esc(fup['recommendation'])}.<br><b>static_graph possible: "
              f"{esc(str(sg['value']))}</b> ({esc(sg['evidence'])}).</p>")
    failure = (f"<p class='error'>The training step failed at step {diag.failure.step}: "
               f"{esc(diag.failure.error)}</p>" if diag.failure else "")
    return (f"<h2>{esc(title)}</h2><div class='banner'>{banner}</div>{failure}"
            + (f"<table><tr><th>severity</th><th>verdict</th><th>where</th><th>tensors</th>"
               f"<th>bytes</th><th>finding and fix</th></tr>{findings}</table>" if findings
               else "<p>No findings: every tensor is wired correctly.</p>")
            + advice + _figure_img(grad_norm_figure(diag.steps, params)) + table)


def render_report(sections: dict, title: str = "diagkit report") -> str:
    body = "".join(render_section(name, diag) for name, diag in sections.items())
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; "
            f"img-src data:; style-src 'unsafe-inline'\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>"
            f"<body><h1>{html.escape(title)}</h1>{body}</body></html>")


def write_report(directory, sections: dict, title: str = "diagkit report") -> Path:
    """Write DIR/report.html atomically: never a half-written file that looks complete."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    target = out / "report.html"
    fd, tmp = tempfile.mkstemp(prefix=".report.", suffix=".html", dir=out)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(render_report(sections, title))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
