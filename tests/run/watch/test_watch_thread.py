"""A watch started in a thread other than the main one: Python lets only the main thread set
signal handlers, so SIGTERM and SIGHUP cannot save it. One line says so as it starts
(docs/watch.md); the watch itself works there as anywhere."""

from __future__ import annotations

import logging
import threading

import torch
from torch import nn

import diagkit
from diagkit.run.watch import ends as watch_ends


def train_in_a_thread(out):
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def run():
        w = diagkit.watch(model, opt, steps=2, out=out)
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
        box.append(w)
    box: list = []
    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    return box[0]


def test_a_watch_off_the_main_thread_says_a_kill_saves_nothing(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="diagkit"):
        w = train_in_a_thread(tmp_path / "diag")
    said = [r.getMessage() for r in caplog.records if r.name == "diagkit"]
    assert said == [watch_ends.OFF_MAIN_THREAD]
    assert w.done and diagkit.load(tmp_path / "diag").meta["steps_observed"] == 2


def test_in_the_main_thread_nothing_is_said(tmp_path, caplog):
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING, logger="diagkit"):
        w = diagkit.watch(model, opt, steps=1)
        opt.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
    assert w.done and not [r for r in caplog.records if r.name == "diagkit"]
