"""`take_inventory`'s lr and weight_decay columns: those of the tensor's own group.

Kept apart from `test_inventory.py` (naming is changed there by other work): the fix here is
only `inventory._hyper`.
"""

from __future__ import annotations

import torch
from torch import nn

from diagkit.measure.model.inventory import take_inventory


def test_weight_decay_is_its_own_groups_not_the_first_positive_one():
    model = nn.Linear(2, 2)
    # The bias is in optimizer 0 without decay and (a bug of its own) in optimizer 1 with it:
    # the row names optimizer 0, group 0, so its lr and weight decay are that group's.
    first = torch.optim.AdamW([{"params": [model.weight], "weight_decay": 0.1},
                               {"params": [model.bias], "weight_decay": 0.0, "lr": 0.5}],
                              lr=0.01)
    second = torch.optim.SGD([model.bias], lr=0.2, weight_decay=0.3)
    rows = {row["name"]: row for row in take_inventory(model, [first, second]).rows}
    bias = rows["bias"]
    assert bias["memberships"] == ((0, 1), (1, 0))
    assert (bias["optimizer"], bias["group"]) == (0, 1)
    assert bias["lr"] == 0.5 and bias["weight_decay"] == 0.0  # it was 0.3, optimizer 1's
    assert rows["weight"]["weight_decay"] == 0.1
    # Reversed, the row is optimizer 1's group, and its decay is that group's.
    rows = {row["name"]: row for row in take_inventory(model, [second, first]).rows}
    assert rows["bias"]["weight_decay"] == 0.3 and rows["bias"]["lr"] == 0.2
