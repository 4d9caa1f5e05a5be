"""How the tracker tests read back what a run holds, from the trackers' own local files: a W&B
offline run's transaction log, a Trackio project's SQLite store. Shared by the standalone tests
(tests/run/trackers/test_trackers_wandb.py, test_trackers_trackio.py) and those under a framework
(tests/integrations/test_trackers_frameworks_wandb_trackio.py).

W&B offline keeps every record of a run in `run-<id>.wandb` (what `wandb sync` uploads); wandb
0.31 ships no Python reader for it, so `records` reads its block format (LevelDB's log: a 7-byte
file header, 32 KiB blocks, each record a 7-byte header and a `wandb_internal_pb2.Record`).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

WANDB_OFFLINE = {  # W&B local-only: no network, no telemetry, no code or git capture, quiet
    "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off",
    "WANDB_DISABLE_CODE": "true", "WANDB_DISABLE_GIT": "true", "WANDB_ERROR_REPORTING": "false",
    "WANDB_X_DISABLE_STATS": "true", "WANDB_X_DISABLE_MACHINE_INFO": "true",
}
# Where W&B writes (runs, staging, cache, config): each set to a folder of the test's own.
WANDB_DIRS = ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR",
              "WANDB_ARTIFACT_DIR")
# What a Trackio side's process must not inherit: anything that points trackio elsewhere.
TRACKIO_REMOTE = ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL", "TRACKIO_WRITE_TOKEN",
                  "TRACKIO_BUCKET_ID", "TRACKIO_DATASET_ID", "TRACKIO_WEBHOOK_URL", "SPACE_ID",
                  "SYSTEM")


def wandb_offline(mp, home: Path) -> None:
    """Set W&B offline with every folder under `home` (`mp`: a pytest MonkeyPatch)."""
    for key, value in WANDB_OFFLINE.items():
        mp.setenv(key, value)
    for key in WANDB_DIRS:
        mp.setenv(key, str(home / key.lower()))
    mp.delenv("WANDB_API_KEY", raising=False)


def records(run_file: Path) -> list:
    """The records of an offline run's transaction log, in order."""
    from wandb.proto import wandb_internal_pb2
    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    out, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, size, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + size]
        pos += 7 + size
        if kind in (1, 4):  # a FULL record, or the LAST piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def finished_records(run_file: Path, timeout: float = 30.0) -> list:
    """The records once the run's `exit` record is written: W&B's service writes the file on
    its own, and may still be at it when `finish()` returns."""
    deadline = time.monotonic() + timeout
    while True:
        found = records(run_file)
        if any(r.WhichOneof("record_type") == "exit" for r in found):
            return found
        assert time.monotonic() < deadline, f"no exit record in {run_file}"
        time.sleep(0.05)


def read_back(run) -> dict:
    """What the finished offline run holds: history rows, the final summary, metric
    definitions, alerts, artifacts (as dicts), and the files folder."""
    found = {"history": [], "summary": {}, "metric": [], "alert": [], "artifact": []}
    for record in finished_records(Path(run.settings.sync_file)):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            found["history"].append({"/".join(i.nested_key) or i.key: json.loads(i.value_json)
                                     for i in record.history.item})
        elif kind == "summary":
            for item in record.summary.update:
                key = "/".join(item.nested_key) or item.key
                found["summary"][key] = json.loads(item.value_json)
        elif kind == "metric":
            found["metric"].append((record.metric.name or record.metric.glob_name,
                                    record.metric.step_metric))
        elif kind == "alert":
            found["alert"].append((record.alert.title, record.alert.text, record.alert.level))
        elif kind == "artifact":
            found["artifact"].append((record.artifact.name, record.artifact.type,
                                      sorted(c.path for c in record.artifact.manifest.contents)))
    found["files"] = Path(run.settings.files_dir)
    return found


def diagkit_rows(history: list[dict]) -> list[tuple]:
    """The series' points (W&B's step_sync also puts `diagkit/step` in the table's row)."""
    return [(h["diagkit/step"], h["diagkit/errors"], h["diagkit/warnings"])
            for h in history if "diagkit/errors" in h]


def wandb_table(got: dict) -> dict:
    """The findings table W&B saved in the run's files: {"columns": [...], "data": [...]}."""
    folder = (got["files"] / got["summary"]["diagkit/findings/path"]).parent
    (table_file,) = folder.glob("findings_*")
    return json.loads(table_file.read_text())


def trackio_read(project: str, name: str, run_id: str | None = None) -> dict:
    """A Trackio run's rows (timestamps left out), alerts and, given its id, artifacts, from
    trackio's storage (in the process whose `TRACKIO_DIR` holds the store)."""
    from trackio import SQLiteStorage
    logs = [{k: v for k, v in row.items() if k != "timestamp"}
            for row in SQLiteStorage.get_logs(project, name)]
    alerts = [{k: a[k] for k in ("title", "text", "level", "step")}
              for a in SQLiteStorage.get_alerts(project, run_name=name)]
    found = {"logs": logs, "alerts": alerts}
    if run_id is not None:
        found["artifacts"] = SQLiteStorage.get_run_artifacts(project, name, run_id)["output"]
    return found


def trackio_script_stored(script: Path, folder: Path, timeout: float) -> dict:
    """Run `script FOLDER` in a fresh interpreter (Trackio reads TRACKIO_DIR once, at import)
    with its store in FOLDER/store, tests/helpers importable and nothing that reaches a Space;
    what the script wrote to FOLDER/stored.json."""
    env = {k: v for k, v in os.environ.items() if k not in TRACKIO_REMOTE}
    env.update(TRACKIO_DIR=str(folder / "store"), HF_HUB_OFFLINE="1",
               HF_HUB_DISABLE_TELEMETRY="1", GRADIO_ANALYTICS_ENABLED="False",
               PYTHONPATH=os.pathsep.join(p for p in (str(Path(__file__).resolve().parent),
                                                      env.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, str(script), str(folder)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    return json.loads((folder / "stored.json").read_text())
