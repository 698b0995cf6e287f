"""Tidy results: provenance columns, atomic CSV writes, the machine tag.

Every row carries `provenance(machine, preset, edition)`: the course's edition it answers, the
machine and its software as the job saw them. `cuda` is the CUDA this machine runs (`none`
without a GPU), `torch_cuda` the CUDA torch was built for, `gpu_index` the card(s) the job
measured on (nvidia-smi's indices); driver, GPU clock and power limit come from `nvidia-smi`
(absent: `–`); the git commit is suffixed `-dirty` when tracked files differ from it, and
`git_dirty_files` names them.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import pandas as pd

from cs336_systems.planning.cores import CPU_SET_ENV, format_cpulist, usable_cores
from cs336_systems.planning.edition import DEFAULT_EDITION
from cs336_systems.planning.log import get_logger
from cs336_systems.planning.machine import tag_for
from cs336_systems.planning.neighbours import ID_ENV

log = get_logger(__name__)

PROVENANCE_COLUMNS = [
    "machine",
    "preset",
    "edition",
    "device_name",
    "torch",
    "triton",
    "cuda",
    "torch_cuda",
    "driver",
    "nccl",
    "nsys",
    "cpu_model",
    "cpu_cores",
    "gpu_count",
    "gpu_index",
    "cpu_set",
    "job_id",
    "gpu_sm_clock_max_mhz",
    "gpu_power_limit_w",
    "git_commit",
    "git_dirty_files",
    "timestamp",
]
ABSENT = "–"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return cpu_model()


def machine_tag() -> str:
    """A short name for this machine as torch sees it: the GPU model (with a count if several),
    or `cpu`. The workflow finds the same tag without torch (`planning/machine.py:machine_tag`)."""
    import torch

    if torch.cuda.is_available():
        return tag_for([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
    return tag_for([])


def _run(cmd: list[str], cwd: Path | None = None, timeout: float = 10) -> str | None:
    """stdout of a command, or None when it is missing or fails."""
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_state(root: str | os.PathLike) -> tuple[str, list[str]]:
    """(commit, dirty files) of the git tree at `root`: the short commit, suffixed `-dirty`
    when tracked files differ from it, and those files; ('unknown', []) outside git (or
    $CS336_GIT_COMMIT, which wins when set: a copy of the tree whose .git is stale or absent)."""
    if pinned := os.environ.get("CS336_GIT_COMMIT"):
        # set by whoever copied the tree (the GPU scripts: the device's copy has a stale .git)
        return pinned, []
    commit = (_run(["git", "rev-parse", "--short=12", "HEAD"], cwd=Path(root)) or "").strip()
    if not commit:
        return os.environ.get("CS336_GIT_COMMIT", "unknown"), []
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=Path(root)) or ""
    files = sorted({line[3:].split(" -> ")[-1].strip() for line in status.splitlines() if line})
    return commit + ("-dirty" if files else ""), files


@cache
def _package_git_state() -> tuple[str, tuple[str, ...]]:
    commit, files = git_state(Path(__file__).resolve().parents[3])
    return commit, tuple(files)


def git_commit() -> str:
    return _package_git_state()[0]


@cache
def nvidia_smi() -> dict[str, str]:
    """Driver, max SM clock and power limit of GPU 0 from `nvidia-smi` ({} without it)."""
    if shutil.which("nvidia-smi") is None:
        return {}
    fields = ["driver_version", "clocks.max.sm", "power.limit"]
    out = _run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
    if not out or not out.strip():
        return {}
    values = [v.strip() for v in out.strip().splitlines()[0].split(",")]
    return {
        k: v for k, v in zip(fields, values, strict=False) if v and "N/A" not in v and "[" not in v
    }


@cache
def nsys_version() -> str:
    """`nsys --version` of the Nsight Systems found through $NSYS or PATH, or 'absent'."""
    exe = os.environ.get("NSYS") or shutil.which("nsys")
    if not exe:
        return "absent"
    out = _run([exe, "--version"], timeout=30)
    if not out:
        return "absent"
    m = re.search(r"\d+\.\d+[\w.\-]*", out)
    return m.group(0) if m else out.strip()


def gpu_index() -> str:
    """Which of the host's GPUs this job measured on: nvidia-smi's indices of the cards
    planning/claim.py claimed for it, else CUDA_VISIBLE_DEVICES' entries, else every index."""
    import torch

    from cs336_systems.planning.claim import CLAIMED_ENV

    if claimed := os.environ.get(CLAIMED_ENV):
        return claimed
    if (visible := os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()) and visible[0] != "-":
        return visible
    return ",".join(str(i) for i in range(torch.cuda.device_count()))


def machine_provenance() -> dict:
    """The machine's software and hardware as a job sees it (see the module docstring)."""
    import torch

    from cs336_systems.core.device import available_cores

    cuda_ok = torch.cuda.is_available()
    nccl = "none"
    if cuda_ok:
        try:
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        except (AttributeError, RuntimeError):
            nccl = ABSENT
    smi = nvidia_smi() if cuda_ok else {}
    commit, dirty = _package_git_state()
    return {
        "cuda": (torch.version.cuda or ABSENT) if cuda_ok else "none",
        "torch_cuda": torch.version.cuda or "none",
        "driver": smi.get("driver_version", ABSENT),
        "nccl": nccl,
        "nsys": nsys_version(),
        "cpu_model": cpu_model(),
        "cpu_cores": available_cores(),
        "gpu_count": torch.cuda.device_count() if cuda_ok else 0,
        "gpu_index": gpu_index() if cuda_ok else ABSENT,
        # the cores the job ran on (its claim's share, planning/cores.py) and its record's id,
        # which names the jobs beside it (planning/neighbours.py)
        "cpu_set": os.environ.get(CPU_SET_ENV) or format_cpulist(usable_cores()),
        "job_id": os.environ.get(ID_ENV, ""),
        "gpu_sm_clock_max_mhz": smi.get("clocks.max.sm", ABSENT),
        "gpu_power_limit_w": smi.get("power.limit", ABSENT),
        "git_commit": commit,
        "git_dirty_files": " ".join(dirty),
    }


def provenance(machine: str, preset: str, edition: int = DEFAULT_EDITION) -> dict:
    """The columns every row carries (`edition`: the course's, whose size table the row's
    size names resolve in)."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - triton ships with torch on Linux
        triton_version = "absent"
    row = {
        "machine": machine,
        "preset": preset,
        "edition": int(edition),
        "device_name": device_name(),
        "torch": torch.__version__,
        "triton": triton_version,
        **machine_provenance(),
        "timestamp": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    return {c: row[c] for c in PROVENANCE_COLUMNS}


def provenance_meanwhile(
    machine: str, preset: str, edition: int = DEFAULT_EDITION
) -> Callable[[], dict]:
    """`provenance`, read in a thread from now on; calling the result returns its columns (once
    read). A distributed stage's launching process starts it before it starts its workers: the
    torch import and the CUDA and nvidia-smi queries (seconds on a GPU host) then run while the
    workers start, not before them on cards already held."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="provenance")
    future = pool.submit(provenance, machine, preset, edition)
    pool.shutdown(wait=False)
    return future.result


def _umask() -> int:
    """The process's umask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a temp file and a rename. The file gets the mode a plain
    `open()` would give it (0644 under umask 022): mkstemp's own 0600 would leave results in a
    group's shared folder unreadable to the rest of the group."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
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


def read_csv(path: str | os.PathLike, **kwargs) -> pd.DataFrame:
    """A results CSV with every float as written. pandas before 3.0 parses floats with a fast
    converter that can land a few ULPs off (the H100 reference's report, rendered on the device's
    pandas, printed fp32's 0.01 as 0.0099999997764825, not 0.009999999776482582): round-trip
    parsing there; pandas 3 parses exactly and deprecates the option."""
    if int(pd.__version__.split(".")[0]) < 3:
        kwargs = {"float_precision": "round_trip", **kwargs}
    return pd.read_csv(path, **kwargs)


def concat_csvs(paths: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """A stage's per-job CSVs as one frame (empty files skipped): what its aggregate writes,
    with its suspect numbers flagged (reporting/aggregate.py)."""
    frames = [read_csv(p) for p in paths if Path(p).stat().st_size > 0]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# ---- the `sanity` column: what reporting/sanity.py's checks doubt in a row -------------------

# a row's flags, `suspect: <why>` ('' when none), and the kinds of number they doubt
COLUMN = "sanity"
SCOPE_COLUMN = "sanity_scope"
PREFIX = "suspect: "


def text_column(column: pd.Series) -> pd.Series:
    """A text column, '' where empty: a CSV whose column is empty throughout reads back as
    float NaN (filling that with '' is deprecated in pandas)."""
    return column.astype(object).where(column.notna(), "").astype(str)


def is_suspect(df: pd.DataFrame, scope: str | None = None) -> pd.Series:
    """Rows flagged suspect; with `scope` ('time', 'rate', 'memory'), only those whose flags
    doubt numbers of that kind (or all of a row's numbers)."""
    if COLUMN not in df:
        return pd.Series(False, index=df.index)
    flagged = text_column(df[COLUMN]).str.startswith(PREFIX)
    if scope is None:
        return flagged
    if SCOPE_COLUMN not in df:
        return flagged
    kinds = text_column(df[SCOPE_COLUMN]).str.split(";")
    return flagged & kinds.map(lambda ks: scope in ks or "all" in ks or ks == [""])


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
