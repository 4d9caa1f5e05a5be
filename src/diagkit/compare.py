"""What changed between two checkpoints, tensor by tensor (`diagkit compare CKPT_A CKPT_B`).

A tensor that is bitwise identical in two saves taken some steps apart was not trained between
them: the orphan of the first seed (`mem_tokens`, in no optimizer group) shows up here as plainly
as in a diagnosis, from the checkpoints alone. Findings are grouped per module subtree, as a
diagnosis groups its verdicts.

Measures files only (no model, no hooks), and streams them: a PyTorch zip checkpoint is
memory-mapped (`torch.load(..., mmap=True)` through `checkpoint.read_checkpoint`, so bad files get
its one-line errors), a `.safetensors` file is read one key at a time; each tensor is compared in
slices of at most `CHUNK` elements, and the mapped pages of a slice are handed back to the kernel
once it is measured. Peak memory is a few slices, not the two files. (A legacy, non-zip `.pt`
file cannot be mapped and is loaded whole.)
"""

from __future__ import annotations

import ctypes
import dataclasses
import html
import math
import mmap
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .checkpoint import align_prefix, brief, find_state_dict, read_checkpoint
from .diagnosis import Diagnosis, records, to_jsonable, write_json_atomic
from .errors import DiagkitError
from .findings import Finding, subtrees, subject, human_bytes, sort_findings
from .text import severity_summary

CHUNK = 1 << 18  # elements of one tensor read, compared and released at a time

# name -> meaning. Order is the column order of `Comparison.table`.
COLUMNS: dict[str, str] = {
    "name": "tensor name (in A's spelling when only the `module.` prefix differs)",
    "module": "dotted name of the module that owns it ('' for the root)",
    "status": "changed, unchanged, only_in_a, only_in_b or shape_mismatch",
    "in_a": "present in checkpoint A",
    "in_b": "present in checkpoint B",
    "shape_a": "tuple of ints (None when absent)",
    "shape_b": "tuple of ints (None when absent)",
    "dtype_a": "e.g. 'torch.float32' (None when absent)",
    "dtype_b": "e.g. 'torch.float32' (None when absent)",
    "numel": "elements (B's when present, else A's)",
    "bytes": "numel * element size (B's when present, else A's)",
    "identical": "same shape and every element equal: bitwise when the dtypes agree, by value "
                 "when they differ",
    "max_abs_diff": "max |B - A| over elements (NaN unless the shapes agree)",
    "delta_norm": "L2 norm of B - A",
    "norm_a": "L2 norm of A",
    "relative_change": "delta_norm / norm_a (0 when identical, inf when A is all zeros)",
}
STATUSES = ("shape_mismatch", "unchanged", "only_in_a", "only_in_b", "changed")


# ------------------------------------------------------------------ reading, lazily
def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):  # pragma: no cover
        return None


_LIBC = _libc()
_MADV_DONTNEED = 4


class _MappedPages:
    """Hands the pages of a measured slice back to the kernel, when the slice lies in this
    process's private mapping of the checkpoint file (torch.load's mmap, safetensors' reads).

    The pages stay in the page cache and are read again from the file if touched; a private
    mapping that was never written holds nothing else. A slice anywhere else (a copy, a tensor
    built by trusted unpickling code) is left alone. Linux only; elsewhere a no-op.
    """

    def __init__(self, path):
        st = os.stat(path)
        self.file = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
        self.ranges: list[tuple[int, int]] = []
        self.looked: set[str] = set()

    def _read_maps(self) -> None:
        ranges = []
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 6 or not parts[1].endswith("p"):
                    continue
                major, minor = (int(x, 16) for x in parts[3].split(":"))
                if (major, minor, int(parts[4])) == self.file:
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    ranges.append((lo, hi))
        self.ranges = ranges

    def release(self, key: str, chunk: torch.Tensor) -> None:
        if _LIBC is None:
            return
        page = mmap.PAGESIZE
        start = chunk.data_ptr()
        stop = start + chunk.numel() * chunk.element_size()
        start, stop = -(-start // page) * page, stop // page * page
        if stop <= start:
            return
        inside = any(lo <= start and stop <= hi for lo, hi in self.ranges)
        if not inside and key not in self.looked:  # a mapping made since: look once per tensor
            self.looked.add(key)
            self._read_maps()
            inside = any(lo <= start and stop <= hi for lo, hi in self.ranges)
        if inside:
            _LIBC.madvise(start, stop - start, _MADV_DONTNEED)


class _TorchFile:
    """A PyTorch checkpoint: read_checkpoint memory-maps it (torch.save's zip format), so a
    tensor's bytes are read only when a slice of it is measured."""

    def __init__(self, path, trust: bool):
        self.state = find_state_dict(read_checkpoint(path, trust), str(path))
        self.pages = _MappedPages(path)

    def keys(self) -> list[str]:
        return list(self.state)

    def meta(self, key: str) -> tuple[tuple[int, ...], torch.dtype]:
        t = self.state[key]
        return tuple(t.shape), t.dtype

    def rows(self, key: str, start: int | None, stop: int | None) -> torch.Tensor:
        t = self.state[key]
        if t.is_quantized:
            t = t.dequantize()
        elif t.layout != torch.strided:
            t = t.to_dense()
        return (t if start is None else t[start:stop]).reshape(-1)

    def close(self) -> None:
        self.state = {}


class _SafetensorsFile:
    """A `.safetensors` file, read one key (or a block of rows) at a time."""

    def __init__(self, path):
        from safetensors import safe_open
        from safetensors.torch import _TYPES
        file = Path(path)
        if not file.is_file() or file.stat().st_size == 0:
            read_checkpoint(path)  # raises its one-line error for a missing or empty file
        try:
            self.handle = safe_open(str(path), framework="pt")
            self._keys = list(self.handle.keys())
        except Exception as exc:
            raise DiagkitError(f"checkpoint {path} is not a readable safetensors file: "
                               f"{type(exc).__name__}: {brief(exc)}") from None
        if not self._keys:
            raise DiagkitError(f"checkpoint {path} holds no tensors")
        self._types = _TYPES
        self.pages = _MappedPages(path)

    def keys(self) -> list[str]:
        return self._keys

    def meta(self, key: str) -> tuple[tuple[int, ...], torch.dtype | str]:
        sl = self.handle.get_slice(key)
        return tuple(sl.get_shape()), self._types.get(sl.get_dtype(), sl.get_dtype())

    def rows(self, key: str, start: int | None, stop: int | None) -> torch.Tensor:
        if start is None:
            return self.handle.get_tensor(key).reshape(-1)
        return self.handle.get_slice(key)[start:stop].reshape(-1)

    def close(self) -> None:
        self.handle = None


def _is_safetensors(path) -> bool:
    """By suffix, or by content: an 8-byte little-endian header length, then a JSON object."""
    if str(path).endswith(".safetensors"):
        return True
    try:
        with open(path, "rb") as fh:
            head = fh.read(9)
            size = os.fstat(fh.fileno()).st_size
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < size


def _open(path, trust: bool):
    return _SafetensorsFile(path) if _is_safetensors(path) else _TorchFile(path, trust)


# ------------------------------------------------------------------ measuring
def _row_blocks(shape: tuple[int, ...]):
    """(start, stop) row ranges of at most ~CHUNK elements; (None, None) for the whole tensor."""
    numel = math.prod(shape)
    if not shape or numel <= CHUNK:
        yield None, None
        return
    per_row = max(numel // shape[0], 1)
    step = max(CHUNK // per_row, 1)
    for start in range(0, shape[0], step):
        yield start, min(start + step, shape[0])


def _float64(x: torch.Tensor) -> torch.Tensor:
    return (torch.view_as_real(x) if x.is_complex() else x).reshape(-1).to(torch.float64)


def _measure(a, key_a, b, key_b, shape, same_dtype: bool) -> dict:
    identical, max_abs, delta_sq, a_sq = True, 0.0, 0.0, 0.0
    for start, stop in _row_blocks(shape):
        x, y = a.rows(key_a, start, stop), b.rows(key_b, start, stop)
        x64 = _float64(x)
        a_sq += float(torch.dot(x64, x64)) if x64.numel() else 0.0
        same = (torch.equal(x.view(torch.uint8), y.view(torch.uint8)) if same_dtype
                else torch.equal(x64, _float64(y)))
        if not same:
            identical = False
            d = (_float64(y) - x64).abs_()
            largest = float(d.max())  # NaN when an element is NaN: it stays NaN
            max_abs = largest if math.isnan(largest) else max(max_abs, largest)
            delta_sq += float(torch.dot(d, d))
            del d
        del x64
        a.pages.release(key_a, x)
        b.pages.release(key_b, y)
    norm_a, delta = math.sqrt(a_sq), (0.0 if identical else math.sqrt(delta_sq))
    if identical:
        relative = 0.0
    elif norm_a > 0:
        relative = delta / norm_a
    else:
        relative = math.inf if delta > 0 or math.isnan(delta) else 0.0
    return {"identical": identical, "max_abs_diff": 0.0 if identical else max_abs,
            "delta_norm": delta, "norm_a": norm_a, "relative_change": relative}


def _itemsize(dtype) -> int:
    return dtype.itemsize if isinstance(dtype, torch.dtype) else 0


def _row(name, a, key_a, b, key_b) -> dict:
    row = {"name": name, "module": name.rsplit(".", 1)[0] if "." in name else "",
           "in_a": key_a is not None, "in_b": key_b is not None,
           "shape_a": None, "shape_b": None, "dtype_a": None, "dtype_b": None,
           "identical": False, "max_abs_diff": math.nan, "delta_norm": math.nan,
           "norm_a": math.nan, "relative_change": math.nan}
    metas = {}
    for side, file, key in (("a", a, key_a), ("b", b, key_b)):
        if key is not None:
            shape, dtype = file.meta(key)
            metas[side] = (shape, dtype)
            row[f"shape_{side}"], row[f"dtype_{side}"] = shape, str(dtype)
    shape, dtype = metas.get("b", metas.get("a"))
    row["numel"] = math.prod(shape)
    row["bytes"] = row["numel"] * _itemsize(dtype)
    if key_a is None:
        row["status"] = "only_in_b"
    elif key_b is None:
        row["status"] = "only_in_a"
    elif metas["a"][0] != metas["b"][0]:
        row["status"] = "shape_mismatch"
    else:
        row.update(_measure(a, key_a, b, key_b, shape, metas["a"][1] == metas["b"][1]))
        row["status"] = "unchanged" if row["identical"] else "changed"
    return row


# ------------------------------------------------------------------ the result
@dataclasses.dataclass
class Comparison:
    path_a: str
    path_b: str
    table: pd.DataFrame
    findings: list[Finding]
    summary: dict

    # A diagnosis's rules, as they are: the highest severity among the findings (None when
    # there is none), and whether that is at or above `--fail-on`.
    worst = Diagnosis.worst
    fails = Diagnosis.fails

    def to_json_dict(self) -> dict:
        """Strict JSON (NaN and inf become null): summary, one object per tensor, findings."""
        return to_jsonable({"summary": self.summary, "tensors": records(self.table),
                            "findings": [f.to_dict() for f in self.findings],
                            "worst": self.worst()})

    def render_text(self, width: int = 100) -> str:
        """For the terminal: a header line, then one block per finding with its fix."""
        import textwrap
        s = self.summary
        verdict = severity_summary(self.findings)
        lines = [f"diagkit compare: {s['path_a']} -> {s['path_b']}: {_totals(s)} — "
                 f"{verdict or 'no findings'}"]
        for f in self.findings:
            where = f.module or ("(whole model)" if f.count else "")
            lines += ["", f"[{f.severity}] {f.code}: {where}  ({f.count} tensor"
                          f"{'s' if f.count != 1 else ''}, {human_bytes(f.bytes)})"]
            lines += textwrap.wrap(f.message, width, initial_indent="  ",
                                   subsequent_indent="  ")
            lines += textwrap.wrap(f.fix, width, initial_indent="  fix: ",
                                   subsequent_indent="       ", break_on_hyphens=False)
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return f"<div class='diagkit'>{banner_html(self)}{findings_html(self)}</div>"

    def __repr__(self) -> str:
        return (f"<Comparison {self.summary['tensors']} tensors, {self.summary['changed']} "
                f"changed, {self.summary['unchanged']} unchanged, worst={self.worst()}>")


def _totals(s: dict) -> str:
    parts = [f"{s['in_both']} tensors in both ({human_bytes(s['bytes_in_both'])})",
             f"{s['changed']} changed", f"{s['unchanged']} unchanged"]
    for key, words in (("only_in_a", "only in A"), ("only_in_b", "only in B"),
                       ("shape_mismatch", "with another shape")):
        if s[key]:
            parts.append(f"{s[key]} {words}")
    return ", ".join(parts)


def compare_checkpoints(path_a, path_b, trust: bool = False) -> Comparison:
    """Compare two checkpoints tensor by tensor (A the earlier save, B the later one).

    Each may be a PyTorch file (a bare state dict or one nested under model, state_dict, ...;
    loaded with weights_only unless `trust`) or a `.safetensors` file. Names that differ only
    by the DDP prefix `module.` are aligned (A's spelling is kept). Bad input raises
    DiagkitError with a one-line reason.
    """
    a = _open(path_a, trust)
    b = _open(path_b, trust)
    try:
        keys_a = {k: k for k in a.keys()}
        keys_b = align_prefix({k: k for k in b.keys()}, set(keys_a))
        if not set(keys_a) & set(keys_b):
            raise DiagkitError(
                f"checkpoints {path_a} and {path_b} have no tensor name in common "
                f"({len(keys_a)} and {len(keys_b)} tensors, e.g. {next(iter(keys_a))!r} and "
                f"{next(iter(keys_b))!r}): they are not saves of the same model")
        names = list(keys_a) + [n for n in keys_b if n not in keys_a]
        rows = [_row(n, a, keys_a.get(n), b, keys_b.get(n)) for n in names]
    finally:
        a.close()
        b.close()
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    table = table.astype({"numel": np.int64, "bytes": np.int64, "identical": bool,
                          "in_a": bool, "in_b": bool})
    summary = _summary(table, str(path_a), str(path_b))
    return Comparison(str(path_a), str(path_b), table,
                      _findings(table, summary, _same_file(path_a, path_b)), summary)


def _same_file(path_a, path_b) -> bool:
    try:
        return os.path.samefile(path_a, path_b)
    except OSError:  # pragma: no cover
        return False


def _summary(table: pd.DataFrame, path_a: str, path_b: str) -> dict:
    status = table["status"]
    both = table["in_a"] & table["in_b"]
    size = table["bytes"]
    out = {"path_a": path_a, "path_b": path_b, "tensors": len(table),
           "in_both": int(both.sum()), "bytes": int(size.sum()),
           "bytes_in_both": int(size[both].sum())}
    for key in STATUSES:
        out[key] = int((status == key).sum())
        out[f"{key}_bytes"] = int(size[status == key].sum())
    out["dtype_mismatch"] = int((both & (table["dtype_a"] != table["dtype_b"])).sum())
    finite = table["relative_change"][status == "changed"]
    finite = finite[np.isfinite(finite)]
    out["max_relative_change"] = float(finite.max()) if len(finite) else None
    return out


# ------------------------------------------------------------------ findings
# Leaf names of the tensors ordinary layers own; anything else was added by hand (memory or
# prompt tokens, LoRA factors, a class token), which is often exactly what was meant to train.
LAYER_LEAVES = {"weight", "bias", "running_mean", "running_var", "num_batches_tracked",
                "in_proj_weight", "in_proj_bias", "weight_g", "weight_v", "weight_orig"}


def _groups(table: pd.DataFrame, universe: pd.Series, flagged: pd.Series):
    """(label, rows) per module subtree, as a diagnosis groups a verdict (findings.subtrees);
    `universe` is the set of tensors a subtree must be whole within."""
    frame = table[universe].reset_index(drop=True).assign(in_model=True)
    hits = flagged[universe].to_numpy(dtype=bool)
    if not hits.any():
        return
    for label, rows, whole in subtrees(frame, hits):
        group = frame.iloc[rows].copy()
        group.attrs["whole"] = whole
        yield label, group


def _names(names, most: int = 4) -> str:
    names = list(names)
    shown = ", ".join(f"`{n}`" for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _findings(table: pd.DataFrame, s: dict, same_file: bool) -> list[Finding]:
    findings: list[Finding] = []

    def add(code, severity, label, group, message, fix):
        findings.append(Finding(code, severity, tuple(group["name"]), message, fix, module=label,
                                count=len(group), bytes=int(group["bytes"].sum())))

    status = table["status"]
    both = table["in_a"] & table["in_b"]
    comparable = status.isin(["changed", "unchanged"])
    if s["unchanged"] and not s["changed"]:
        group = table[status == "unchanged"]
        message = (f"all {len(group)} tensors present in both checkpoints with the same shape "
                   f"({human_bytes(int(group['bytes'].sum()))}) are bitwise identical: nothing "
                   "changed between these saves"
                   + (" (A and B are the same file)." if same_file else "."))
        fix = ("If training ran between the two saves, check that optimizer.step() is reached "
               "and that the second save happens after it, from the live model (not a copy "
               "taken earlier).")
        findings.append(Finding("nothing_changed", "info", (), message, fix, module="",
                                count=len(group), bytes=int(group["bytes"].sum())))
    elif s["unchanged"]:
        for label, group in _groups(table, comparable, status == "unchanged"):
            extras = [n for n in group["name"] if n.rsplit(".", 1)[-1] not in LAYER_LEAVES]
            message = (f"{subject(label, group)} is bitwise identical in both checkpoints, while "
                       f"{s['changed']} other tensor{'s' if s['changed'] != 1 else ''} changed: "
                       "nothing trained it between these saves.")
            if extras:
                message += (f" Not a layer's weight or bias (added by hand, often meant to "
                            f"train): {_names(extras)}.")
            fix = ("Frozen on purpose (a pretrained backbone, buffers)? Then nothing to do. If "
                   "it should learn: it must require grad and be held by an optimizer, by "
                   "identity — `diagkit check TARGET` reports it as orphan or stalled.")
            if label.startswith("module.") or group["name"].iloc[0].startswith("module."):
                fix += (" Its name carries the DDP prefix `module.`: a parameter filter on names "
                        "(e.g. `not n.startswith(\"module.…\")`) is a common cause.")
            add("unchanged", "warning", label, group, message, fix)
    for code, side, other, verb in (("only_in_a", "A", "B", "removed or renamed"),
                                    ("only_in_b", "B", "A", "added or renamed")):
        universe = table[f"in_{side.lower()}"]
        for label, group in _groups(table, universe, status == code):
            message = (f"{subject(label, group)} is only in {side} (`{s[f'path_{side.lower()}']}`),"
                       f" not in {other}: {verb} between the saves.")
            fix = ("If it was renamed, map the old names to the new ones before "
                   "load_state_dict; if the change is intended, load with strict=False and "
                   f"check the {'unexpected' if side == 'A' else 'missing'} keys it reports.")
            add(code, "info", label, group, message, fix)
    for label, group in _groups(table, both, status == "shape_mismatch"):
        shapes = "; ".join(f"`{n}` {_shape(a)} in A, {_shape(b)} in B" for n, a, b in
                           group[["name", "shape_a", "shape_b"]].head(3).itertuples(index=False))
        message = (f"{subject(label, group)} has another shape in each checkpoint ({shapes}"
                   f"{'; …' if len(group) > 3 else ''}): the model changed between the saves.")
        fix = ("load_state_dict fails on these names: build the model with the configuration "
               "the checkpoint was saved with, or skip or resize these tensors explicitly.")
        add("shape_mismatch", "warning", label, group, message, fix)
    dtype_differs = comparable & (table["dtype_a"] != table["dtype_b"])
    for label, group in _groups(table, both, dtype_differs):
        first = group.iloc[0]
        message = (f"{subject(label, group)} is stored as {first['dtype_a']} in A and "
                   f"{first['dtype_b']} in B: compared by value, not bitwise.")
        fix = "Nothing to do if the cast is intended (e.g. a half-precision export)."
        add("dtype_mismatch", "info", label, group, message, fix)
    return sort_findings(findings)


def _shape(shape) -> str:
    if shape is None:
        return "—"
    return "×".join(map(str, shape)) if len(shape) else "scalar"


# ------------------------------------------------------------------ presenting
def _ordered(table: pd.DataFrame) -> np.ndarray:
    """Row positions: problems first (shape mismatch, unchanged, only in one file), then the
    changed tensors, the largest relative change first."""
    rank = table["status"].map({s: i for i, s in enumerate(STATUSES)}).to_numpy()
    change = pd.to_numeric(table["relative_change"], errors="coerce").fillna(-1).to_numpy()
    key = np.where(table["status"].to_numpy() == "changed", -change, 0)
    return np.lexsort((np.arange(len(table)), key, rank))


def _status_severity(cmp: Comparison) -> dict[str, str]:
    codes = {f.code: f.severity for f in cmp.findings}
    return {status: codes.get(status, "ok") for status in STATUSES}


def banner_html(cmp: Comparison) -> str:
    """Tensors and bytes per status, problems first and coloured by the severity of their
    finding; the two files and the totals. Every name is escaped."""
    from .tables import severity_chip
    s, severity = cmp.summary, _status_severity(cmp)
    chips = "".join(
        severity_chip(severity[status], f"<b>{status}</b> {s[status]} tensor"
                                        f"{'s' if s[status] != 1 else ''}, "
                                        f"{human_bytes(s[f'{status}_bytes'])}")
        for status in STATUSES if s[status])
    esc = html.escape
    return (f'<div class="diagkit-banner banner"><div>{chips}</div>'
            f'<p style="margin:4px 0">A: <code>{esc(s["path_a"])}</code> → B: '
            f'<code>{esc(s["path_b"])}</code></p>'
            f'<p style="margin:4px 0">{esc(_totals(s))}</p></div>')


def findings_html(cmp: Comparison) -> str:
    """The findings with their fixes (the diagnosis's findings table)."""
    from .tables import findings_table
    if not cmp.findings:
        return ('<p class="diagkit-findings">No findings: every tensor present in both '
                'checkpoints changed, and both hold the same names and shapes.</p>')
    return findings_table(cmp.findings)


TABLE_COLUMNS = ("name", "status", "shape", "dtype", "bytes", "relative_change", "delta_norm",
                 "norm_a", "max_abs_diff")


def table_styler(cmp: Comparison, limit: int = 200):
    """One row per tensor, problems first, as a pandas Styler: names escaped, numbers with 3
    significant digits, at most `limit` rows (the caption says how many were left out)."""
    from .tables import SEVERITY_COLORS, fmt_number, style_rows
    t = cmp.table
    order = _ordered(t)
    shown = t.iloc[order[:max(int(limit), 0)]]
    shape = [(_shape(a) if a == b or b is None else
              _shape(b) if a is None else f"{_shape(a)} → {_shape(b)}")
             for a, b in zip(shown["shape_a"], shown["shape_b"])]
    dtype = [(a if a == b or b is None else b if a is None else f"{a} → {b}")
             for a, b in zip(shown["dtype_a"], shown["dtype_b"])]
    view = pd.DataFrame({
        "name": shown["name"].astype(str), "status": shown["status"], "shape": shape,
        "dtype": [str(d).removeprefix("torch.") for d in dtype],
        "bytes": shown["bytes"].map(human_bytes),
        **{c: shown[c].map(fmt_number) for c in ("relative_change", "delta_norm", "norm_a",
                                                  "max_abs_diff")},
    }, columns=list(TABLE_COLUMNS)).reset_index(drop=True).astype(object)
    view.loc[shown["relative_change"].to_numpy() == math.inf, "relative_change"] = "from 0"
    severity = _status_severity(cmp)
    colours = [SEVERITY_COLORS[severity[s]] for s in view["status"]]
    caption = f"{len(t)} tensors"
    if len(shown) < len(t):
        caption = (f"{len(shown)} of {len(t)} tensors shown, problems first, then the largest "
                   f"relative changes; comparison.csv has them all.")
    return style_rows(view, colours, "status", caption)


def change_figure(cmp: Comparison, max_labels: int = 40):
    """Relative change ‖B − A‖ / ‖A‖ per tensor present in both with the same shape, in file
    order, on a log axis. Unchanged tensors are red crosses on the left edge, tensors that
    start from all zeros triangles on the right edge; names label the rows up to
    `max_labels` tensors."""
    from matplotlib.figure import Figure
    from .tables import SEVERITY_COLORS, truncate_left
    t = cmp.table[cmp.table["status"].isin(["changed", "unchanged"])]
    n = len(t)
    labelled = 0 < n <= max_labels
    fig = Figure(figsize=(9.5, min(1.8 + (0.22 * n if labelled else 3.0), 24)),
                 layout="constrained")
    ax = fig.add_subplot()
    title = "relative change ‖B − A‖ / ‖A‖ per tensor"
    ax.set_title(title)
    if not n:
        ax.text(0.5, 0.5, "no data: no tensor is in both checkpoints with the same shape",
                ha="center", va="center", transform=ax.transAxes, color="0.35")
        ax.set_xticks([])
        ax.set_yticks([])
        return fig
    rel = t["relative_change"].to_numpy(dtype=float)
    y = np.arange(n)
    moved = (t["status"] == "changed").to_numpy() & np.isfinite(rel) & (rel > 0)
    lo = rel[moved].min() if moved.any() else 1e-6
    hi = rel[moved].max() if moved.any() else 1e-6
    floor, ceiling = lo / 10, hi * 10
    ax.set_xscale("log")
    ax.set_xlim(floor / 2, ceiling * 2)
    ax.scatter(rel[moved], y[moved], s=18, color="tab:blue", label="changed", zorder=3)
    if labelled:
        ax.hlines(y[moved], floor / 2, rel[moved], color="tab:blue", lw=0.8, alpha=0.4)
    same = (t["status"] == "unchanged").to_numpy()
    warn = SEVERITY_COLORS["warning" if _status_severity(cmp)["unchanged"] != "ok" else "ok"][1]
    if same.any():
        ax.scatter(np.full(same.sum(), floor), y[same], marker="x", s=40, color=warn, zorder=4,
                   label="unchanged (bitwise identical)")
    fresh = (t["status"] == "changed").to_numpy() & ~moved
    if fresh.any():
        ax.scatter(np.full(fresh.sum(), ceiling), y[fresh], marker=">", s=36, color="tab:purple",
                   zorder=4, label="changed from all zeros")
    ax.set_ylim(n - 0.5, -0.5)  # file order, top down
    ax.set_xlabel("relative change (log)")
    if labelled:
        ax.set_yticks(y, [truncate_left(name, 48) for name in t["name"]], fontsize=7.5,
                      family="monospace", parse_math=False)
        for tick, is_same in zip(ax.get_yticklabels(), same):
            tick.set_color(warn if is_same else "0.15")
    else:
        ax.set_ylabel(f"{n} tensors, in file order")
    ax.grid(axis="x", which="major", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8, framealpha=0.9)
    return fig


def write_outputs(cmp: Comparison, out_dir: str | None) -> list[str]:
    """comparison.csv (every tensor) and findings.json (summary + findings), each atomically."""
    if not out_dir:
        return []
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    table = cmp.table.copy()
    for col in ("shape_a", "shape_b"):
        table[col] = table[col].map(lambda s: "" if s is None else " ".join(map(str, s)))
    fd, tmp = tempfile.mkstemp(prefix=".comparison.csv.", dir=folder)
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            table.to_csv(fh, index=False)
        os.replace(tmp, folder / "comparison.csv")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    write_json_atomic(folder / "findings.json", {
        "summary": cmp.summary, "findings": [f.to_dict() for f in cmp.findings],
        "worst": cmp.worst()})
    return ["comparison.csv", "findings.json"]


# ------------------------------------------------------------------ the notebook's contract
REPO = Path(__file__).resolve().parents[2]

# name -> (accepted types, default, what it means). notebooks/compare_checkpoints.ipynb's
# parameters cell mirrors this (a test keeps them in step).
PARAMETERS: dict[str, tuple[tuple[type, ...], object, str]] = {
    "checkpoint_a": ((str,), "data/meta_memory_step2.pt", "the earlier checkpoint (.pt or "
                                                          ".safetensors)"),
    "checkpoint_b": ((str,), "data/meta_memory_step5.pt", "the later checkpoint"),
    "trust_checkpoint": ((bool,), False, "allow arbitrary unpickling (only for files you "
                                         "trust)"),
    "out_dir": ((str, type(None)), "", "folder for comparison.csv and findings.json (\"\": "
                                       "none)"),
}


def validate(values: dict) -> dict:
    """Check names and types; return every parameter, defaults filled in (what `diagkit report`
    checks before it runs the notebook)."""
    from .workbook import validate as validate_contract
    return validate_contract(values, PARAMETERS)


def check_parameters(namespace: dict) -> dict:
    """Called by the notebook right after its parameters: an unknown name papermill injected,
    or a wrong type, is an error. Relative checkpoint paths not found from the working folder
    are looked up in the repository (where the demo checkpoints live)."""
    from .workbook import check_parameters as check_contract
    settings = check_contract(namespace, PARAMETERS)
    for name in ("checkpoint_a", "checkpoint_b"):
        settings[name] = resolve_path(settings[name])
    return settings


def resolve_path(path: str) -> str:
    """`path` as given if it exists from here (or is absolute); else the repository's file of
    that relative name when there is one."""
    if not path or Path(path).is_absolute() or Path(path).exists():
        return path
    candidate = REPO / path
    return str(candidate) if candidate.exists() else path


def run(settings: dict) -> Comparison:
    """What the notebook's comparing cell does."""
    return compare_checkpoints(settings["checkpoint_a"], settings["checkpoint_b"],
                               trust=settings["trust_checkpoint"])
