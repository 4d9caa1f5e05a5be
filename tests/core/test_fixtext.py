"""A fix's form (core/fixtext.py): alternatives of words then code, read back apart, and an
older save's one line of words still reads."""

from __future__ import annotations

import ast

from hypothesis import given, strategies as st

from diagkit.core import fixtext

FIX = fixtext.compose(
    ("Add it to an optimizer:", 'optimizer.add_param_group({"params": [model.head.weight]})'),
    ("Or, if it should stay fixed, freeze it:",
     "for p in [model.head.weight]:\n    p.requires_grad_(False)"),
    ("Nothing to paste for this one.", None))


def test_alternatives_come_back_as_words_and_code_blocks():
    assert fixtext.parts(FIX) == [
        ("words", "Add it to an optimizer:"),
        ("code", 'optimizer.add_param_group({"params": [model.head.weight]})'),
        ("words", "Or, if it should stay fixed, freeze it:"),
        ("code", "for p in [model.head.weight]:\n    p.requires_grad_(False)"),
        ("words", "Nothing to paste for this one.")]
    assert fixtext.first_code(FIX).startswith("optimizer.add_param_group(")
    for kind, text in fixtext.parts(FIX):
        if kind == "code":
            ast.parse(text)  # a block pastes as is: its own indentation survives


def test_an_older_one_line_fix_is_words():
    old = 'Add it to an optimizer: optimizer.add_param_group({"params": [model.a]})'
    assert fixtext.parts(old) == [("words", old)]
    assert fixtext.first_code(old) == "" and fixtext.first_line(old) == old
    assert fixtext.parts("") == [] and fixtext.first_line("") == ""


words = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")),
                min_size=1).map(str.strip).filter(bool)
code = st.lists(st.from_regex(r"[a-z_]+\([a-z0-9_, ]*\)", fullmatch=True), min_size=1,
                max_size=3).map("\n".join)


@given(st.lists(st.tuples(words, st.one_of(st.none(), code)), min_size=1, max_size=4))
def test_compose_then_parts_gives_back_what_went_in(alternatives):
    expected = []
    for w, c in alternatives:
        expected.append(("words", w))
        if c:
            expected.append(("code", c))
    assert fixtext.parts(fixtext.compose(*alternatives)) == expected
