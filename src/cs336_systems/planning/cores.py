"""Each GPU job's own share of the host's CPU cores, so that jobs side by side do not take each
other's cores.

A host of C usable cores and G GPUs gives each card C // G cores: the card's NUMA-local cores
where `nvidia-smi topo -m` names them (its "CPU Affinity" column), split evenly among the cards
that share them, else an even slice of the usable cores by the card's place in the pool. A job
on several cards gets the union of their shares. planning/claim.py pins the job to its share
(`sched_setaffinity`, which its child processes inherit) and sizes its thread pools to it
(`thread_env`): OpenMP and MKL, Inductor's compile workers; pytest-xdist's workers and
a distributed stage's ranks read the share from the process's affinity. A host with fewer than
MIN_CORES_PER_GPU cores a card runs fewer GPU jobs at once (`gpu_slots`). Standard library only.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Sequence

# a GPU job's host side (the Python thread launching kernels, the data and the allocator) needs
# a core of its own; a second keeps compile workers and the logging pipe off it
MIN_CORES_PER_GPU = 2
CPU_SET_ENV = "CS336_CPU_SET"


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11] (Linux's cpulist format); [] for 'N/A'."""
    cores: set[int] = set()
    for part in text.replace(" ", "").split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            cores.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cores)


def format_cpulist(cores: Iterable[int]) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8'."""
    runs: list[list[int]] = []
    for c in sorted(set(cores)):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def parse_topology(text: str) -> dict[int, list[int]]:
    """{GPU index: its NUMA-local cores} from `nvidia-smi topo -m`'s matrix ({} without the
    "CPU Affinity" column)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header = next((ln for ln in lines if "CPU Affinity" in ln), None)
    if header is None:
        return {}
    names = [h.strip() for h in header.split("\t")]
    column = names.index("CPU Affinity")
    found = {}
    for line in lines:
        cells = [c.strip() for c in line.split("\t")]
        name = cells[0]
        if name.startswith("GPU") and name[3:].isdigit() and len(cells) > column:
            found[int(name[3:])] = parse_cpulist(cells[column])
    return found


def gpu_topology(timeout_s: float = 20.0) -> dict[int, list[int]]:
    """This host's GPUs' NUMA-local cores ({} where nvidia-smi cannot say)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_topology(out.stdout) if out.returncode == 0 else {}


def card_share(
    card: int, pool: Sequence[int], usable: Sequence[int], local: dict[int, list[int]]
) -> list[int]:
    """`card`'s cores: len(usable) // len(pool) of them (at least one), from its NUMA-local
    cores when they hold a share for each card that shares them, else by its place in `pool`."""
    usable = sorted(usable)
    per = max(1, len(usable) // max(1, len(pool)))
    mine = [c for c in local.get(card, []) if c in set(usable)]
    peers = [g for g in pool if sorted(local.get(g, [])) == sorted(local.get(card, []))]
    if mine and len(mine) >= per * len(peers):
        at = peers.index(card) * per
        return mine[at : at + per]
    at = (list(pool).index(card) * per) % max(1, len(usable))
    return usable[at : at + per] or usable[:per]


def job_share(
    cards: Sequence[int], pool: Sequence[int], usable: Sequence[int], local: dict[int, list[int]]
) -> list[int]:
    """The union of `cards`' shares (a distributed job's)."""
    return sorted({c for card in cards for c in card_share(card, pool, usable, local)})


def thread_env(cores: Sequence[int]) -> dict[str, str]:
    """Thread pools sized to the job's cores, and the share itself for its rows."""
    n = str(max(1, len(cores)))
    return {
        "OMP_NUM_THREADS": n,
        "MKL_NUM_THREADS": n,
        "OPENBLAS_NUM_THREADS": n,
        "TORCHINDUCTOR_COMPILE_THREADS": n,
        CPU_SET_ENV: format_cpulist(cores),
    }


def usable_cores() -> list[int]:
    """The cores this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def gpu_slots(gpus: int, cores: int) -> int:
    """GPU jobs a host runs at once: one a card, while each gets MIN_CORES_PER_GPU cores."""
    if gpus <= 0:
        return 0
    return max(1, min(gpus, cores // MIN_CORES_PER_GPU))


def rank_share(cores: Sequence[int], local_rank: int, local_world: int) -> list[int]:
    """A rank's slice of its job's cores (all of them when there are fewer than ranks)."""
    cores = sorted(cores)
    per = len(cores) // max(1, local_world)
    if per < 1:
        return cores
    return cores[local_rank * per : (local_rank + 1) * per]
