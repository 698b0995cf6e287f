"""Give a job GPUs of its own: claim free cards, then run the job on them alone.

    python -m cs336_systems.planning.claim N COMMAND [ARGS...]

claims N of this host's GPUs that no other job holds, sets `CUDA_VISIBLE_DEVICES` to them
(nvidia-smi's indices, with `CUDA_DEVICE_ORDER=PCI_BUS_ID` so CUDA numbers them alike) and
`CS336_GPU_CLAIMED` (the same indices, which the rows' `gpu_index` column records), and
replaces itself with COMMAND. The workflow's measuring rules start their stage through it with
their `gpu` resource (`$PY -m cs336_systems.planning.claim {resources.gpu} $PY -m ...`):
Snakemake's resource keeps the number of GPU jobs at the number of GPUs, and this picks which
card each one gets, so that under `--cores 4` on a 4-GPU host four measurements run at once,
each alone on its card.

A claim is an exclusive `flock` on one lock file per card (named by its UUID) in
$CS336_GPU_LOCKS (default /tmp/cs336-gpu-locks, shared by the host's users and runs). The lock
belongs to the job's process, which inherits the descriptor across `exec`: however the job ends
(a crash, SIGKILL, a killed Snakemake), the kernel releases it, and nothing stale is left. A job
finding too few free cards (another run on the host holds them) waits, saying so.

The cards to choose from are $CS336_GPU_POOL (nvidia-smi indices: the workflow's shell prefix
sets the GPUs it planned with, `CUDA_VISIBLE_DEVICES` applied), else the GPUs this host shows
(planning/machine.py). N = 0, no GPU, a SLURM job (SLURM gives each job its own GPUs) or
CS336_GPU_CLAIM=off: COMMAND runs with the environment unchanged.

A job that claims cards also gets their share of the host's CPU cores (planning/cores.py): it is
pinned to them, its thread pools are sized to them, and `CS336_CPU_SET` names them for its
rows. Where $CS336_JOB_RECORDS names a folder (the workflow's shell prefix does), COMMAND runs as
a child instead, with a record of when it ran, on which cards and cores
(planning/neighbours.py): the report names the jobs that ran beside each row's. Standard
library only.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from cs336_systems.planning import cores, machine, neighbours
from cs336_systems.planning.log import configure, get_logger

log = get_logger(__name__)

POOL_ENV = "CS336_GPU_POOL"
LOCKS_ENV = "CS336_GPU_LOCKS"
CLAIMED_ENV = "CS336_GPU_CLAIMED"
SWITCH_ENV = "CS336_GPU_CLAIM"
DEFAULT_LOCKS = Path("/tmp/cs336-gpu-locks")
POLL_S = 1.0
# how often a waiting job says again that it waits
REMIND_S = 60.0


@dataclass(frozen=True)
class Card:
    index: int  # nvidia-smi's (PCI bus order)
    uuid: str = ""

    @property
    def lock_name(self) -> str:
        return f"{self.uuid or f'index{self.index}'}.lock"


def pool_from_env(text: str, installed: list[machine.Gpu]) -> list[Card]:
    """Cards of $CS336_GPU_POOL ('0,2,3'), with the UUIDs of the installed GPUs."""
    cards = []
    for entry in (e.strip() for e in text.split(",")):
        if entry.isdigit():
            i = int(entry)
            cards.append(Card(i, installed[i].uuid if i < len(installed) else ""))
    return cards


def pool() -> list[Card]:
    """The cards a job may claim: $CS336_GPU_POOL, else the GPUs visible here."""
    installed = machine.installed_gpus()
    if (text := os.environ.get(POOL_ENV)) is not None:
        return pool_from_env(text, installed)
    visible = machine.visible_gpus()
    return [Card(i, installed[i].uuid) for i in machine.gpu_indices(visible)]


def lock_dir() -> Path:
    """The host's lock folder: shared by its users (sticky, world-writable), else this user's."""
    if env := os.environ.get(LOCKS_ENV):
        folder = Path(env)
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    folder = DEFAULT_LOCKS
    try:
        folder.mkdir(mode=0o1777, exist_ok=True)
        if folder.stat().st_uid == os.getuid():
            folder.chmod(0o1777)  # mkdir's mode passes through the umask
    except OSError:
        pass
    if os.access(folder, os.W_OK | os.X_OK):
        return folder
    mine = folder.with_name(f"{folder.name}-{os.getuid()}")
    mine.mkdir(exist_ok=True)
    return mine


def try_lock(folder: Path, card: Card) -> int | None:
    """An open descriptor holding `card`'s lock, or None when another process holds it."""
    path = folder / card.lock_name
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    try:
        os.fchmod(fd, 0o666)  # others' runs lock it too
    except OSError:
        pass
    # who holds it, for a person looking at the folder
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {' '.join(sys.argv[2:])[:300]}\n".encode(), 0)
    return fd


def claim(n: int, cards: list[Card], folder: Path) -> list[tuple[Card, int]]:
    """Lock `n` free cards (all of them if fewer exist), waiting while too few are free."""
    n = min(n, len(cards))
    waited, said = 0.0, -REMIND_S
    while True:
        held = []
        for card in cards:
            if len(held) == n:
                break
            fd = try_lock(folder, card)
            if fd is not None:
                held.append((card, fd))
        if len(held) == n:
            if waited:
                log.info("GPU(s) %s free after %.0f s", [c.index for c, _ in held], waited)
            return held
        for _, fd in held:
            os.close(fd)
        if waited - said >= REMIND_S:
            busy = [c.index for c in cards if not any(c == h for h, _ in held)]
            log.warning(
                "waiting for %d free GPU(s) of %s: held by other jobs (%s; lock files in %s)",
                n,
                [c.index for c in cards],
                busy,
                folder,
            )
            said = waited
        time.sleep(POLL_S)
        waited += POLL_S


def claimed_env(cards: list[Card]) -> dict[str, str]:
    indices = ",".join(str(c.index) for c in cards)
    return {
        "CUDA_VISIBLE_DEVICES": indices,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        CLAIMED_ENV: indices,
    }


def wanted(n: int) -> bool:
    """Whether this job claims cards at all (see the module docstring)."""
    return (
        n > 0
        and os.environ.get(SWITCH_ENV, "on").lower() not in ("off", "0", "no")
        and "SLURM_JOB_ID" not in os.environ
    )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or not argv[0].isdigit():
        sys.exit("usage: python -m cs336_systems.planning.claim N COMMAND [ARGS...]")
    n, command = int(argv[0]), argv[1:]
    cards = pool() if wanted(n) else []
    held_cards: list[int] = []
    if cards:
        configure("gpus")
        held = claim(n, cards, lock_dir())
        for _, fd in held:
            os.set_inheritable(fd, True)  # the lock lives as long as the job's process
        os.environ.update(claimed_env([c for c, _ in held]))
        held_cards = [c.index for c, _ in held]
        pin(held_cards, [c.index for c in cards])
    folder = os.environ.get(neighbours.FOLDER_ENV)
    if not folder:
        os.execvp(command[0], command)
    sys.exit(run_recorded(command, Path(folder), held_cards))


def run_recorded(command: list[str], folder: Path, cards: list[int]) -> int:
    """Run `command` as a child, with a record of when it ran, on which cards and cores
    (planning/neighbours.py); a signal to this process is passed on to it. Its exit status."""
    job = neighbours.new_id()
    os.environ[neighbours.ID_ENV] = job
    record = {
        "job": job,
        "what": neighbours.describe(command),
        "cards": cards,
        "cpu_set": cores.format_cpulist(cores.usable_cores()),
        "start": time.time(),
    }
    neighbours.write(folder, record)
    child = subprocess.Popen(command)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    code = child.wait()
    neighbours.write(folder, {**record, "end": time.time(), "returncode": code})
    return code if code >= 0 else 128 - code


def pin(held: list[int], pool_indices: list[int]) -> None:
    """Give the job its cards' share of the host's cores (planning/cores.py) and size its
    thread pools to it; the child processes inherit both."""
    usable = cores.usable_cores()
    share = cores.job_share(held, pool_indices, usable, cores.gpu_topology())
    try:
        os.sched_setaffinity(0, share)
    except (AttributeError, OSError) as e:  # pragma: no cover - not Linux, or not allowed
        log.warning("cannot pin the job to cores %s: %s", cores.format_cpulist(share), e)
        return
    for key, value in cores.thread_env(share).items():  # a job's own setting wins
        os.environ[key] = value if key == cores.CPU_SET_ENV else os.environ.get(key, value)
    log.info(
        "GPU(s) %s: CPU cores %s (%d of %d)",
        held,
        cores.format_cpulist(share),
        len(share),
        len(usable),
    )


if __name__ == "__main__":
    main()
