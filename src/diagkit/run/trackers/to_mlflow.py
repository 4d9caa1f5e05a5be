"""MLflow (`report_to="mlflow"`; docs/integrations.md, "Trackers").

diagkit sends only to a run that is open: the active run (`mlflow.start_run()`, HF's
`MLflowCallback`) or the one it is given: Lightning's `MLFlowLogger` (its `.experiment` is an
`MlflowClient`, its `.run_id` the run), a `(client, run_id)` pair, or an `mlflow` Run. The run
id and tracking URI are taken as the watch starts and every call names them (`MlflowClient`), so
what comes at the end still lands after the framework ended its run (HF's `on_train_end` runs
before a user callback's); diagkit never starts or ends a run.

What lands: metrics `diagkit/errors` and `diagkit/warnings` per observed step; at the end the
counts at the last step and the tag `diagkit/status` (a short word: MLflow limits tag values);
the findings table as the artifact `diagkit/findings_table.json` (`log_table`: the UI shows it
as a table); each alert appended to the artifact `diagkit/alerts.txt` (MLflow has no alerts);
with report=True the saved diagnosis's folder under the artifact path `diagkit/`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ...present import tracked
from .sink import Sink

# Artifact paths: the saved folder goes under ARTIFACT_DIR (its own findings.json included),
# so the table has a name of its own.
TABLE_FILE, ALERTS_FILE = "diagkit/findings_table.json", "diagkit/alerts.txt"
ARTIFACT_DIR = "diagkit"


def owns(obj) -> bool:
    """Whether `obj` names an MLflow run: a `(MlflowClient, run_id)` pair, an `mlflow` Run
    (or ActiveRun), or a Lightning `MLFlowLogger` (only an object of an mlflow-named module is
    asked for `.experiment`: another logger's would start its own run)."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is None:
        return False
    if isinstance(obj, tuple):
        return len(obj) == 2 and isinstance(obj[0], mlflow.MlflowClient) \
            and isinstance(obj[1], str)
    if isinstance(obj, mlflow.entities.Run):
        return True
    return "mlflow" in type(obj).__module__.lower() and hasattr(obj, "run_id") \
        and isinstance(getattr(obj, "experiment", None), mlflow.MlflowClient)


def active() -> bool:
    """Whether this thread has an MLflow run open (without importing mlflow: not imported, no
    run)."""
    mlflow = sys.modules.get("mlflow")
    try:
        return mlflow is not None and mlflow.active_run() is not None
    except Exception:
        return False


def open(context, given=None) -> "MlflowSink | None":
    """A sink for `given`'s run or the active run; None (one line) when no run is open."""
    import mlflow  # only here: mlflow is optional
    if given is not None:
        client, run_id = _client_and_run(mlflow, given)
    else:
        run = mlflow.active_run()
        if run is None:
            context.say("diagkit: report_to 'mlflow': no MLflow run is open (start one with "
                        "mlflow.start_run()); not sending to it")
            return None
        client, run_id = mlflow.MlflowClient(mlflow.get_tracking_uri()), run.info.run_id
    return MlflowSink(client, run_id)


def _client_and_run(mlflow, given) -> tuple:
    if isinstance(given, tuple):
        return given
    if isinstance(given, mlflow.entities.Run):
        return mlflow.MlflowClient(mlflow.get_tracking_uri()), given.info.run_id
    return given.experiment, given.run_id


class MlflowSink(Sink):
    """Every call names the run id taken at open; synchronous, so `flush` has nothing left."""

    name = "mlflow"

    def __init__(self, client, run_id: str):
        self.client, self.run_id = client, run_id
        self.last_step = 0
        self.alerts: list[str] = []

    def scalars(self, values: dict[str, float], step: int) -> None:
        self._metrics(values, step)
        self.last_step = max(self.last_step, step)

    def summary(self, values: dict) -> None:
        self._metrics({k: v for k, v in values.items() if k != tracked.STATUS}, self.last_step)
        self.client.set_tag(self.run_id, tracked.STATUS, str(values[tracked.STATUS]),
                            synchronous=True)

    def table(self, rows: list[list]) -> None:
        """`log_table`: the UI lists it as a table. Object columns: pandas 3's str columns make
        MLflow's `log_table` warn into the user's output."""
        import pandas as pd
        frame = pd.DataFrame(rows, columns=list(tracked.TABLE_COLUMNS), dtype=object)
        self.client.log_table(self.run_id, frame, TABLE_FILE)

    def alert(self, title: str, text: str, level: str, step: int | None = None) -> None:
        """All alerts so far, one a line, rewritten as one artifact."""
        self.alerts.append(f"{level}: {title}: {text}")
        self.client.log_text(self.run_id, "\n".join(self.alerts) + "\n", ALERTS_FILE)

    def artifacts(self, folder: Path) -> None:
        self.client.log_artifacts(self.run_id, str(folder), ARTIFACT_DIR)

    def series(self, points: list[tuple[int, dict[str, float]]]) -> None:
        """A window's points in one `log_batch` (one write, not one a step)."""
        self._metrics_at(points)
        self.last_step = max([self.last_step] + [step for step, _ in points])

    def _metrics(self, values: dict, step: int) -> None:
        self._metrics_at([(step, values)])

    def _metrics_at(self, points) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        metrics = [Metric(key, float(value), now, int(step))
                   for step, values in points for key, value in values.items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics, synchronous=True)
