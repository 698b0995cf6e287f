"""Tidy results: provenance columns, atomic CSV writes, the machine tag."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import tempfile
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import pandas as pd

from cs336_systems.core.log import configure, get_logger
from cs336_systems.core.machine import tag_for

log = get_logger(__name__)

PROVENANCE_COLUMNS = [
    "machine",
    "preset",
    "device_name",
    "torch",
    "triton",
    "cuda",
    "git_commit",
    "timestamp",
]


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def machine_tag() -> str:
    """A short name for this machine as torch sees it: the GPU model (with a count if several),
    or `cpu`. The workflow finds the same tag without torch (`core/machine.py:machine_tag`)."""
    import torch

    if torch.cuda.is_available():
        return tag_for([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
    return tag_for([])


@cache
def git_commit() -> str:
    root = Path(__file__).resolve().parents[3]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
        commit = out.stdout.strip()
        if not commit:
            return os.environ.get("CS336_GIT_COMMIT", "unknown")
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("CS336_GIT_COMMIT", "unknown")


def provenance(machine: str, preset: str) -> dict:
    """The columns every row carries."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - triton ships with torch on Linux
        triton_version = "absent"
    return {
        "machine": machine,
        "preset": preset,
        "device_name": device_name(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda or "none",
        "git_commit": git_commit(),
        "timestamp": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_csv(rows: Iterable[dict] | pd.DataFrame, path: str | os.PathLike) -> pd.DataFrame:
    """Write rows as a tidy CSV atomically (temp file, then rename); returns the frame."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    atomic_write_text(path, df.to_csv(index=False))
    return df


def with_columns_first(rows: Iterable[dict], first: list[str]) -> pd.DataFrame:
    """Rows as a frame with the provenance columns, then `first`, ahead of the rest."""
    df = pd.DataFrame(list(rows))
    lead = [c for c in [*PROVENANCE_COLUMNS, *first] if c in df.columns]
    return df[[*lead, *[c for c in df.columns if c not in lead]]]


def concat_csvs(paths: Iterable[str | os.PathLike], out: str | os.PathLike) -> pd.DataFrame:
    """Concatenate a stage's per-job CSVs into one (the aggregate rule's work)."""
    frames = [pd.read_csv(p) for p in paths if Path(p).stat().st_size > 0]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return write_csv(df, out)


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="Concatenate per-job CSVs into a stage CSV")
    ap.add_argument("--out", required=True)
    ap.add_argument("inputs", nargs="+")
    args = ap.parse_args(argv)
    configure(Path(args.out).stem)  # the stage's CSV (results/<machine>/<stage>.csv) names it
    df = concat_csvs(args.inputs, args.out)
    log.info("wrote %s: %d rows from %d files", args.out, len(df), len(args.inputs))


if __name__ == "__main__":
    main()


def verdicts(csv_path: str | os.PathLike) -> dict[str, str]:
    """{kernel: 'passed' | 'failed' | 'not run'} from a kernel_tests CSV: failed if any of the
    kernel's tests failed or errored, passed if at least one passed, else not run."""
    path = Path(csv_path)
    if not path.exists() or path.stat().st_size == 0:
        return {}
    df = pd.read_csv(path)
    if len(df) == 0 or "kernel" not in df:
        return {}
    out = {}
    for kernel, group in df.groupby("kernel"):
        if kernel == "other":
            continue
        outcomes = set(group["outcome"])
        if outcomes & {"failed", "error"}:
            out[kernel] = "failed"
        elif "passed" in outcomes:
            out[kernel] = "passed"
        else:
            out[kernel] = "not run"
    return out
