"""The live view as a notebook's cells meet it (docs/workbook.md, "The live view"): a 50-step
watch moves the panel as it goes, without judging at every update; the explorer is built when
the loop leaves the cell, not while it runs on; a cell that ends with the watch still on says
what `stop()` gives; a cell run again stops the earlier watch on its optimizer, in one line.

Each runs in a fresh interpreter under a real IPython shell (`tests/helpers/ipython_runs.py`); a cell
is run through the shell (`run_cell`), so IPython's own cell events fire. The widgets' value
changes are counted as they are set: each is one message to the front end."""

from __future__ import annotations

import re

from ipython_runs import in_ipython

CELL = """
    from IPython import get_ipython
    shell = get_ipython()
    shell.user_ns.update(globals())

    def cell(code):
        result = shell.run_cell(code)
        assert result.success, result.error_in_exec or result.error_before_exec
        return shell.user_ns
"""


def test_a_50_step_watch_moves_the_panel_without_judging_at_every_update():
    got = in_ipython("""
        statuses, plots = [], []
        w = diagkit.watch(model, opt, steps=50, live=True)
        w.live.panel.status.observe(lambda c: statuses.append(c["new"]), names="value")
        w.live.panel.plot.observe(lambda c: plots.append(c["new"]), names="value")
        train(50, sleep=0.1)
        w.live.join(30)
        print(json.dumps({"statuses": statuses, "plots": len(plots), "judged": w.live.judged,
                          "updates": w.live.updates}))
    """)
    counts = [int(m.group(1)) for s in got["statuses"]
              if (m := re.search(r"</b>: (\d+) of 50 steps observed", s))]
    # about a step in 2.5 shows (MIN_GAP = 0.25 s of 0.1 s steps): 5 is a loaded machine's
    assert len({c for c in counts if c < 50}) >= 5, got["statuses"]
    assert counts == sorted(counts)
    assert got["plots"] >= 5  # the grad norm's line grows with the steps
    assert 1 <= got["judged"] < got["updates"] / 2, got


TRAIN_ON = """
w = diagkit.watch(model, opt, steps=5, live=True)
during = []
for i in range(35):
    train(1, sleep=0.05)
    during.append(type(w.live.panel.children[0]).__name__)
w.live.wait_shown(30)
status = w.live.panel.status.value
"""


def test_the_explorer_is_built_when_the_cell_ends_not_while_the_loop_runs_on():
    got = in_ipython(CELL + f"""
    ns = cell({TRAIN_ON!r})
    print(json.dumps({{"done": ns["w"].done, "during": ns["during"], "status": ns["status"],
                      "after": type(ns["w"].live.panel.children[0]).__name__}}))
    """)
    assert got["done"] and set(got["during"]) == {"HTML"}, got["during"]
    assert "5 of 5 steps observed &middot; ended: the explorer opens here when this cell " \
           "ends" in got["status"]
    assert got["after"] == "Explorer"


def test_a_cell_that_ends_with_the_whole_run_on_says_what_stop_gives(tmp_path):
    start = (f"watcher = diagkit.watch(model, opt, steps=None, every=1, "
             f"out={str(tmp_path / 'diag')!r}, live=True)\ntrain(6, sleep=0.02)\n")
    got = in_ipython(CELL + f"""
    ns = cell({start!r})
    deadline = time.monotonic() + 30
    while "the cell ended" not in ns["watcher"].live.panel.status.value and \\
            time.monotonic() < deadline:
        time.sleep(0.05)
    left = ns["watcher"].live.panel.status.value
    ns = cell("train(3); watcher.stop()")
    print(json.dumps({{"left": left,
                      "after": type(ns["watcher"].live.panel.children[0]).__name__}}))
    """)
    assert ("the cell ended; the watch goes on with the run: <code>watcher.stop()</code> ends "
            f"it, with the explorer here and the final save to {tmp_path / 'diag'}") \
        in got["left"]
    assert got["after"] == "Explorer"  # built as the cell that stopped it ended


def test_a_cell_run_again_stops_the_earlier_watch_on_its_optimizer():
    got = in_ipython("""
        import contextlib, io
        first = diagkit.watch(model, opt, steps=50, live=False)
        train(3)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            second = diagkit.watch(model, opt, steps=4, live=False)
        train(4)
        print(json.dumps({"first": first.done, "first_steps": first.diagnosis.meta[
                          "steps_observed"], "second": second.done, "err": err.getvalue(),
                          "second_steps": second.diagnosis.meta["steps_observed"]}))
    """)
    assert got["err"] == ("diagkit: stopped the earlier watch on this optimizer (3 of 50 steps "
                          "observed; its diagnosis stays in it): this one replaces it\n")
    assert got["first"] and got["first_steps"] == 3
    assert got["second"] and got["second_steps"] == 4


def test_a_whole_run_cell_run_again_with_a_new_optimizer_stops_the_earlier_watch():
    """A whole run adopts any new optimizer of its model at its first step: the earlier one
    would watch the new optimizer too."""
    got = in_ipython("""
        import contextlib, io
        first = diagkit.watch(model, opt, steps=None, every=1, live=False)
        train(3)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)   # the cell builds it again
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            second = diagkit.watch(model, opt, steps=None, every=1, live=False)
        train(5)
        print(json.dumps({"first": first.done, "err": err.getvalue(),
                          "events": second.stop().meta["events"]}))
    """)
    # (the lines before it: the earlier watch's findings, logged as it ended)
    assert got["err"].splitlines()[-1] == ("diagkit: stopped the earlier watch on this model (3 "
                                           "steps observed; its diagnosis stays in it): this one "
                                           "replaces it")
    assert got["first"] and got["events"] == []
