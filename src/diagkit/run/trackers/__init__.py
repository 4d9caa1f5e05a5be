"""Sending a watch's findings to the experiment trackers the run already has open (`report_to`;
docs/integrations.md, "Trackers").

    diagkit.watch(model, opt, steps=None, report_to="wandb")   # into the open W&B run

`choose` reads `report_to` and opens one `Sink` per tracker (`to_wandb`, `to_tensorboard`,
`to_mlflow`, `to_trackio`: each imports its package only there); `sender.Sender` sends to them
from a thread of its own, off the training loop; `Trackers` is what a watch holds. Only rank 0
sends. A tracker that is missing, has no open run, or fails is one line and the watch goes on.
"""
