"""Which jobs ran beside which: one record per measuring job, written by planning/claim.py as
the job starts and ends, read when the report checks its rows.

A record is `<folder>/<job id>.json`: {"job": id, "what": the stage and its output, "cards":
the GPUs it held, "cpu_set": its cores, "start", "end" (epoch seconds; no end while it runs or
if it was killed)}. The folder is $CS336_JOB_RECORDS (the workflow's shell prefix sets
results/<machine>/jobs/records). A row carries its job's id (`job_id`, core/results.py), so
that `neighbours(records, id)` names the jobs whose time overlapped its job's. Standard library
only.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

FOLDER_ENV = "CS336_JOB_RECORDS"
ID_ENV = "CS336_JOB_ID"


def new_id() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"


def describe(command: list[str]) -> str:
    """'benchmark results/m/benchmark/points/xl_ctx512_sdpa.csv': the stage and its output."""
    stage = next((w.rsplit(".", 1)[-1] for w in command if w.startswith("cs336_systems.")), "")
    out = next((b for a, b in zip(command, command[1:], strict=False) if a == "--out"), "")
    return " ".join(x for x in (stage, out) if x) or " ".join(command)[:120]


def write(folder: str | os.PathLike, record: dict) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{record['job']}.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, folder / f"{record['job']}.json")


def read(folder: str | os.PathLike) -> dict[str, dict]:
    """{job id: record} of the folder's records (none for a missing folder)."""
    found = {}
    for path in sorted(Path(folder).glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        found[record.get("job", path.stem)] = record
    return found


def neighbours(records: dict[str, dict], job: str) -> list[str]:
    """What ran beside `job`: the records whose time overlapped its, named by `what`. A record
    without an end (a job killed, or still running) counts as running until now."""
    me = records.get(job)
    if me is None:
        return []
    now = time.time()
    start, end = me["start"], me.get("end") or now
    return sorted(
        r.get("what", other)
        for other, r in records.items()
        if other != job and r["start"] < end and start < (r.get("end") or now)
    )
