"""The README and the docs (docs/development.md, "The docs"): the README stays a front page, every
Python block of every page is run by a test or says why not, every relative link and anchor
resolves, every page is in mkdocs.yml, and `mkdocs build --strict` builds them offline. The
README's `diagnose` block and the compare block of docs/checkpoints.md run here."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
from torch import nn

from doc_blocks import (DOCS, README, ROOT, anchors, blocks, headings, pages, prose, rel,
                        snippet)

FRONT_PAGE_LINES = 250
NOT_RUN_AT_MOST = 3  # fragments and torchrun-only blocks: keep them few
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")


def test_the_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) <= FRONT_PAGE_LINES
    first = blocks(README)[0]  # the front door: the two commands come first
    assert first.lang == "bash" and [c.split()[:2] for c in first.body.splitlines()] == [
        ["make", "demo"], ["make", "test"]]
    watch = text.index("diagkit.watch(model, optimizer")  # the two-line watch, early
    assert text.count("\n", 0, watch) < 40
    for page in pages()[1:]:
        assert f"(docs/{page.name})" in text, f"the README does not link {rel(page)}"


def test_every_python_block_is_run_by_a_test_or_says_why_not():
    unmarked, wrong, not_run = [], [], []
    for page in pages():
        for block in blocks(page, "python"):
            where = f"{block.page}:{block.line}"
            if block.kind is None:
                unmarked.append(where)
            elif block.kind == "not run":
                not_run.append(where)
                if len(block.what) < 10:
                    wrong.append(f"{where}: say why it is not run")
            else:
                test = ROOT / block.what
                if not (block.what.startswith("tests/") and test.is_file()):
                    wrong.append(f"{where}: {block.what} is no test file")
                elif block.page not in test.read_text():
                    wrong.append(f"{where}: {block.what} never reads {block.page}")
    assert not unmarked, ("Python blocks with no `<!-- runs: tests/... -->` or `<!-- not run: "
                          f"why -->` line above them: {unmarked}")
    assert not wrong, wrong
    assert len(not_run) <= NOT_RUN_AT_MOST, f"too many blocks not run: {not_run}"


def test_a_marker_stands_right_above_a_python_block():
    """A marker above a shell block, or one left behind by a block moved away, marks nothing."""
    stray = []
    for page in pages():
        text = page.read_text()
        marked = {b.line - 1 for b in blocks(page, "python") if b.kind}
        for number, line in enumerate(text.splitlines(), 1):
            if line.startswith(("<!-- runs:", "<!-- not run:")) and number not in marked:
                stray.append(f"{rel(page)}:{number}")
    assert not stray, stray


def links(page):
    """(target, line) of every Markdown link outside code."""
    text = re.sub(r"`[^`\n]*`", "", prose(page.read_text()))
    for m in LINK.finditer(text):
        yield m["target"], text.count("\n", 0, m.start()) + 1


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in pages():
        for target, line in links(page):
            if re.match(r"[a-z]+:", target):
                continue  # a URL: none is needed, none is checked here
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{rel(page)}:{line}: {target}"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif page.parent == DOCS and dest.parent != DOCS:
                broken.append(f"{where}: a docs page links only to docs pages (mkdocs builds "
                              "docs/ alone)")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                broken.append(f"{where}: no heading with that id (under both GitHub's and "
                              "mkdocs' spelling)")
    assert not broken, "\n".join(broken)


def test_every_docs_page_is_in_the_mkdocs_nav():
    config = (ROOT / "mkdocs.yml").read_text()
    listed = re.findall(r"^\s+- (?:[^:\n]+: )?([\w-]+\.md)\s*$", config, re.M)
    assert sorted(listed) == sorted(p.name for p in DOCS.glob("*.md"))
    for page in DOCS.glob("*.md"):  # one title each
        titles = [line for line in prose(page.read_text()).splitlines()
                  if line.startswith("# ")]
        assert len(titles) == 1 and page.read_text().startswith("# "), rel(page)


CITING = ("src", "tests", "benchmarks", "examples", "notebooks", "scripts")
CITATION = re.compile(r"(?P<page>README|docs/[\w-]+\.md)(?:'s)?[,:]?\s+\\?\"(?P<title>[^\"\\]+)\\?\"")


def citing_files():
    for top in CITING:
        for path in sorted((ROOT / top).rglob("*")):
            if (path.suffix in (".py", ".ipynb", ".md") and "egg-info" not in str(path)
                    and path.name not in ("test_docs.py", "doc_blocks.py")):  # the readers
                yield path
    yield from (ROOT / name for name in ("pyproject.toml", "Makefile", "mkdocs.yml"))


def section_titles(page):
    """What a citation may name: a heading (or the start of one), or a bold list label."""
    text = prose(page.read_text())
    titles = [t.replace("`", "") for _, t, _ in headings(text)]
    return titles + re.findall(r"^\s*- \*\*([^*]+?)\*\*", text, re.M)


def test_every_citation_names_a_page_and_a_section_that_exist():
    """`docs/whole-run.md, "The whole run"`, `README, "Verdicts"`: the page exists and has that
    section, so a section that moves cannot leave its citations behind."""
    wrong = []
    for path in citing_files():
        text = path.read_text()
        flat = re.sub(r"\s*\n\s*(?:#\s*|\"\s*)?", " ", text)  # citations wrapped over lines
        for page in set(re.findall(r"\bdocs/[\w-]+\.md\b", text)):
            if not (ROOT / page).is_file():
                wrong.append(f"{rel(path)}: {page} does not exist")
        for m in CITATION.finditer(flat):
            page = ROOT / m["page"] if m["page"] != "README" else README
            title = m["title"].replace("`", "").strip()
            if page.is_file() and not any(s.startswith(title)
                                          for s in section_titles(page)):
                wrong.append(f"{rel(path)}: {m['page']} has no section {title!r}")
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_mkdocs_builds_the_docs_strictly_and_offline(tmp_path):
    """`make docs`' build, with every proxy pointed at a closed port: nothing is fetched. The
    pages load nothing from outside (a script, a style sheet, a font, an image)."""
    dead = "http://127.0.0.1:9"
    env = {**os.environ, "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "http_proxy": dead,
           "https_proxy": dead, "NO_PROXY": "", "no_proxy": ""}
    site = tmp_path / "site"
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                          str(site)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    built = {p.stem for p in site.glob("*.html")}
    assert {p.stem for p in DOCS.glob("*.md")} <= built
    loads = re.compile(r"<(?:script|link|img|iframe|source)\b[^>]*\b(?:src|href)=\"(?:https?:)?//",
                       re.I)
    outside = [p.name for p in site.rglob("*.html") if loads.search(p.read_text())]
    assert not outside, f"pages that load from outside: {outside}"
    for css in site.rglob("*.css"):
        assert not re.search(r"@import\s+url\(\s*['\"]?(?:https?:)?//", css.read_text()), css


def test_the_readme_diagnose_block_runs_and_finds_the_orphan():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    names = {"model": model, "optimizer": torch.optim.SGD(model[0].parameters(), lr=0.1),
             "next_batch": lambda: torch.randn(6, 4),
             "compute_loss": lambda m, batch: m(batch).pow(2).mean()}
    block = snippet(README, "diagkit.diagnose(", "### Or let diagkit run a few steps itself: "
                    "`diagnose`")
    exec(compile(block, "README.md", "exec"), names)
    diag = names["diag"]
    assert diag.verdicts()["2.weight"] == {"orphan", "grad_not_cleared"}
    assert diag.verdicts()["0.weight"] == {"ok"}
    assert {"find_unused_parameters", "static_graph"} <= set(diag.advice)


def test_the_compare_block_of_the_checkpoints_page_runs(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # its paths are the repository's demo saves
    block = snippet(DOCS / "checkpoints.md", "compare_checkpoints(")
    names = {}
    exec(compile(block, "docs/checkpoints.md", "exec"), names)
    (unchanged,) = [f for f in names["cmp"].findings if f.code == "unchanged"]
    assert "module.metamodel.model.mem_tokens" in unchanged.message
    assert "module.metamodel.model.mem_tokens" in capsys.readouterr().out

