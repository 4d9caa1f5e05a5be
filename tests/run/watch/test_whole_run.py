"""`watch(steps=None, every=k)`: the whole run, with wiring changes seen at the step they
happen, findings that say when they held, alerts once as they appear, no hooks between
observed steps, and memory bounded in the run's length."""

from __future__ import annotations

import logging

import pytest
import torch

import diagkit
from diagkit.core import fixtext
from diagkit.core.errors import DiagkitError
from diagkit.measure.clock.kept_steps import AROUND, SAMPLE
from diagkit.run.watch.whole_run import BURST, WINDOW
from models import MLP, fixed_batch, mse_loss


def frozen_fc1():
    """An MLP whose fc1 starts frozen, its optimizer holding only fc2 (staged unfreezing)."""
    torch.manual_seed(0)
    model = MLP()
    model.fc1.requires_grad_(False)
    return model, torch.optim.SGD(model.fc2.parameters(), lr=0.1)


def train(model, opt, steps, at=None, check=None):
    """An ordinary loop; `at[step](model, opt)` is the user's own mid-run change."""
    batch = fixed_batch()
    for step in range(steps):
        if at and step in at:
            at[step](model, opt)
        opt.zero_grad()
        mse_loss(model, batch).backward()
        opt.step()
        if check is not None:
            check(step)


def unfreeze(model, opt):
    model.fc1.requires_grad_(True)  # ... and forgets the optimizer


def unfreeze_properly(model, opt):
    model.fc1.requires_grad_(True)
    opt.add_param_group({"params": list(model.fc1.parameters())})


def by_code(diag, code):
    return [f for f in diag.findings if f.code == code]


def test_an_unfreeze_that_forgets_the_optimizer_is_an_orphan_from_that_step(caplog):
    model, opt = frozen_fc1()
    with caplog.at_level(logging.INFO, logger="diagkit"):
        w = diagkit.watch(model, opt, steps=None, every=10)
        train(model, opt, 100, at={30: unfreeze})
        diag = w.stop()
    (orphan,) = by_code(diag, "orphan")
    # Step 30 changed under observation: measured with the old wiring, it is dropped.
    assert (orphan.module, orphan.since, orphan.ended) == ("fc1", 31, None)
    assert orphan.until == 90 and "[from step 31; at step 30: fc1.weight, fc1.bias became " \
                                  "trainable" in orphan.message
    # its figures are the last window's, and the tag says so: not those of step 31
    assert "(.grad norm " in orphan.message and \
        orphan.message.endswith("; its figures: observed steps 40-90]"), orphan.message
    assert diag.meta["dropped_steps"] == [{"step": 30, "why": "the wiring changed during it"}]
    assert diag.meta["events"][0]["step"] == 30 and diag.meta["events"][0]["kind"] == "requires_grad"
    assert set(diag.verdicts()["fc1.weight"]) >= {"orphan"}
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    # one short line: severity, verdict, where, the step, the first line of the fix
    (line,) = [e.getMessage() for e in errors]
    assert line.startswith("diagkit: error: orphan in fc1 (2 tensors) from step 31; fix: ")
    assert "model.fc1.parameters()" in line and "\n" not in line and len(line) <= 200, line
    # Observed: the burst at the start and after the change, and one step in 10 otherwise.
    observed = set(diag.steps["step"])
    assert {0, 1, 2, 3, 31, 32, 33, 34, 40, 90} <= observed and not observed & {4, 9, 30, 35}


def test_an_unfreeze_done_right_stays_clean_with_its_events_on_the_timeline():
    model, opt = frozen_fc1()
    w = diagkit.watch(model, opt, steps=None, every=10)
    train(model, opt, 60, at={30: unfreeze_properly})
    diag = w.stop()
    assert diag.worst() is None, [f.message for f in diag.findings]
    assert [e["kind"] for e in diag.meta["events"]] == ["requires_grad", "optimizer"]
    assert all(v == {"ok"} for v in diag.verdicts().values())


def test_a_fix_mid_run_ends_the_finding():
    model, opt = frozen_fc1()
    w = diagkit.watch(model, opt, steps=None, every=10)
    train(model, opt, 100, at={20: unfreeze,
                               60: lambda m, o: o.add_param_group({"params": list(m.fc1.parameters())})})
    (orphan,) = by_code(w.stop(), "orphan")
    assert (orphan.since, orphan.ended) == (21, 61) and orphan.until < 60
    assert f"over steps 21-{orphan.until} (ended at step 61)" in orphan.message


def test_a_learning_rate_that_reaches_zero_is_stalled_from_then():
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD([{"params": model.fc1.parameters()},
                           {"params": model.fc2.parameters()}], lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, [lambda s: 1.0, lambda s: max(0, 1 - s / 50)])
    w = diagkit.watch(model, opt, steps=None, every=7)
    train(model, opt, 100, check=lambda step: sched.step())
    diag = w.stop()
    (stalled,) = by_code(diag, "stalled")
    lr_event = [e for e in diag.meta["events"] if e["kind"] == "lr"]
    # Step 50 is the first that steps with lr 0; it changed under observation (dropped).
    assert lr_event and lr_event[0]["step"] == 50
    assert stalled.module == "fc2" and stalled.since == 51 and stalled.ended is None
    assert "optimizer 0 group 1's lr reached 0" in stalled.message


def hooks(model, opt):
    tensors = sum(len(p._backward_hooks or {}) + len(getattr(p, "_post_accumulate_grad_hooks",
                                                             None) or {})
                  for p in model.parameters())
    return tensors, len(opt._optimizer_step_pre_hooks), len(opt._optimizer_step_post_hooks)


def test_between_observed_steps_only_the_step_counter_stays_on():
    model, opt = frozen_fc1()
    seen = {}
    w = diagkit.watch(model, opt, steps=None, every=5)
    train(model, opt, 30, check=lambda step: seen.setdefault(step, hooks(model, opt)))
    w.stop()
    for step in range(BURST, 29):
        if (step + 1) % 5:  # the next step is not observed
            assert seen[step] == (0, 0, 1), step
    assert hooks(model, opt) == (0, 0, 0)


def test_training_is_bitwise_the_same_under_a_whole_run_watch():
    def run(watched):
        model, opt = frozen_fc1()
        w = diagkit.watch(model, opt, steps=None, every=3) if watched else None
        train(model, opt, 40, at={10: unfreeze_properly, 20: unfreeze})
        if w is not None:
            w.stop()
        return [p.detach().clone() for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(run(True), run(False)))


def test_a_long_run_keeps_a_bounded_number_of_steps():
    model, opt = frozen_fc1()
    w = diagkit.watch(model, opt, steps=None, every=2)
    train(model, opt, 3000, at={1000: unfreeze_properly})
    diag = w.stop()
    kept = diag.meta["kept_steps"]
    bound = AROUND * BURST + SAMPLE + WINDOW
    assert kept["observed"] > 1400 and kept["kept"] <= bound
    assert diag.steps["step"].nunique() == kept["kept"] and diag.meta["windows"] > 150
    assert {1001, 1002, 1003, 1004} <= set(diag.steps["step"])  # around the change


def test_on_finding_and_halt_on_say_it_once_and_never_raise_into_the_loop(capsys):
    model, opt = frozen_fc1()
    got = []
    w = diagkit.watch(model, opt, steps=None, every=5, on_finding=got.append, halt_on="error")
    train(model, opt, 20, at={10: unfreeze})
    assert w.should_stop and [f.code for f in got] == ["orphan", "grad_not_cleared"]
    w.stop()

    def broken(_finding):
        raise RuntimeError("my hook")
    model, opt = frozen_fc1()
    w = diagkit.watch(model, opt, steps=None, every=5, on_finding=broken)
    train(model, opt, 20, at={10: unfreeze})
    assert by_code(w.stop(), "orphan")
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["diagkit: on_finding raised RuntimeError: my hook; it is not called again"]


@pytest.mark.parametrize("options, message", [
    ({"halt_on": "fatal"}, "halt_on must be None, 'error' or 'warning', got 'fatal'"),
    ({"on_finding": 3}, "on_finding must be a callable taking a Finding, got int"),
])
def test_bad_whole_run_options_are_refused_in_one_line(options, message):
    model, opt = frozen_fc1()
    with pytest.raises(DiagkitError, match="^" + message.replace("(", r"\(").replace(")", r"\)")
                       + "$"):
        diagkit.watch(model, opt, steps=None, **options)


def test_a_dict_of_modules_is_named_by_key():
    torch.manual_seed(0)
    enc, dec = MLP(4, 5, 4), MLP(4, 5, 3)
    enc_opt, dec_opt = torch.optim.SGD(enc.parameters(), lr=0.1), torch.optim.SGD(
        dec.fc2.parameters(), lr=0.1)
    w = diagkit.watch({"encoder": enc, "decoder": dec}, [enc_opt, dec_opt], steps=3)
    batch = fixed_batch()
    for _ in range(3):
        enc_opt.zero_grad(), dec_opt.zero_grad()
        dec(enc(batch)).pow(2).mean().backward()
        enc_opt.step(), dec_opt.step()
    diag = w.diagnosis
    assert list(diag.params["name"])[:2] == ["encoder.fc1.weight", "encoder.fc1.bias"]
    assert {f.module for f in by_code(diag, "orphan")} == {"decoder.fc1"}
    with pytest.raises(DiagkitError, match="needs identifier keys"):
        diagkit.watch({"a b": enc}, enc_opt)


def test_the_report_pieces_and_the_explorer_show_the_timeline():
    from diagkit.present import timeline
    from diagkit.present.explorer import explore
    model, opt = frozen_fc1()
    w = diagkit.watch(model, opt, steps=None, every=10)
    train(model, opt, 60, at={30: unfreeze})
    diag = w.stop()
    spans = timeline.timeline_table(diag)
    assert list(spans["code"]) == ["orphan", "grad_not_cleared"] and list(spans["since"]) == [31, 31]
    fig = timeline.timeline_figure(spans, diag.meta["events"], diag.meta["optimizer_steps"])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["orphan: fc1", "grad_not_cleared: fc1"]
    assert [line.get_xdata()[0] for line in ax.lines] == [30]  # the change, marked
    assert [round(p.get_x()) for p in ax.patches] == [31, 31]  # each bar from its first step
    html = timeline.events_html(diag.meta["events"])
    assert "step 30: fc1.weight, fc1.bias became trainable" in html
    assert hasattr(explore(diag).controls, "timeline")
    plain = diagkit.watch(model, opt, steps=2)
    train(model, opt, 2)
    assert not hasattr(explore(plain.diagnosis).controls, "timeline")
    assert timeline.events_html(plain.diagnosis.meta.get("events")) == ""  # none looked for


def replace_head(model, opt):
    """A new head mid-run, added to the optimizer; the old one stays in group 0 (stale)."""
    model.fc2 = torch.nn.Linear(5, 3)
    opt.add_param_group({"params": list(model.fc2.parameters())})


def test_a_head_replaced_mid_run_is_named_apart_from_its_successor():
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = diagkit.watch(model, opt, steps=None, every=10)
    train(model, opt, 100, at={50: replace_head})
    diag = w.stop()
    old = ["<fc2.weight, replaced at step 50>", "<fc2.bias, replaced at step 50>"]
    rows = diag.params.set_index("name")
    assert sorted(rows.index) == sorted(["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                         *old])
    # the new head's steps and verdicts are its own; the old one's run on from step 0
    first = diag.steps.groupby("name")["step"].min()
    assert first["fc2.weight"] == first["fc2.bias"] == 51 and first[old[0]] == 0
    assert rows.loc["fc2.weight", "verdicts"] == ("ok",)
    assert set(rows.loc[old[0], "verdicts"]) == {"unused", "not_in_model"}
    assert not rows.loc[old[0], "in_model"]
    (stale,) = by_code(diag, "not_in_model")
    assert sorted(stale.params) == sorted(old) and stale.since == 51
    assert stale.module == "<fc2, replaced at step 50>"  # what it was, not its optimizer group
    # its fix runs as pasted: the optimizer keeps the model's own tensors and their state only
    exec(fixtext.first_code(stale.fix), {"model": model, "opt": opt})  # noqa: S102
    held = [p for g in opt.param_groups for p in g["params"]]
    assert sorted(map(id, held)) == sorted(map(id, model.parameters()))
    assert set(map(id, opt.state)) <= set(map(id, model.parameters()))
