"""Start distributed workers, bound their time, collect their rows.

The parent side (a stage CLI) calls :func:`launch`: it starts one worker per process, every worker
a ``python -m <module> ...`` of ours, waits at most ``timeout_s`` (a hang becomes an ``error:
timeout ...`` status, never a stuck pipeline) and reads the rows rank 0 wrote to a JSON file.
Points the workers did not finish become rows with the failure as their status
(:func:`fill_missing`).

Topologies:
- ``local``: one machine. The launcher starts the ranks itself, with the environment torchrun
  would give them (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ...) and a file of the launch's own
  temporary directory as their rendezvous (a ``file://`` store: no port, so concurrent jobs never
  collide). torchrun would import torch in a process of its own before the workers do (3 s on a
  GPU host, for every launch); the launcher does what its agent did here: when one rank fails,
  it ends the others.
- ``slurm``: inside an allocation, ``srun`` starts one torchrun per node
  (``--nnodes $SLURM_NNODES --nproc-per-node G``) with a c10d rendezvous on the allocation's first
  node, at a free port picked there (the batch script runs on that node).

Every process gets the NCCL environment our GPU hosts need (NVLink multicast off:
`DISTRIBUTED_ENV`), on top of the caller's environment and any extra settings.

A stage that launches its workers reads its arguments with :func:`parse_stage_args` (the run's
own, its knobs as one `--block`, a worker's) and starts each worker with :func:`worker_argv` (the
same run and block, with the launch's changes).

The worker side calls :func:`init_worker` (process group from the launcher's or torchrun's
environment variables, one GPU per local rank for NCCL), :func:`slowest_rank` (per-iteration max
over ranks) and :func:`write_rows` (rank 0 writes the rows, atomically, after every point).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import logging
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from cs336_systems.core.device import available_cores, gpu_count
from cs336_systems.core.harness import Stopwatch
from cs336_systems.planning.cores import CPU_SET_ENV, rank_share, usable_cores
from cs336_systems.planning.knobs import Knobs, add_block_argument, add_run_arguments, block_text
from cs336_systems.planning.log import get_logger, set_rank

log = get_logger(__name__)

# NVLink multicast (NVLS) must stay off on our two-GPU hosts; harmless everywhere else.
DISTRIBUTED_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
TOPOLOGIES = ("local", "slurm")
# the file the ranks of a local launch meet at (set by `launch`, read by `init_worker`)
RENDEZVOUS_FILE_ENV = "CS336_RENDEZVOUS_FILE"


def stage_command(stage: str, argv: list[str] | None) -> str:
    """The command line that ran (and reruns) a stage's job: `python3 -m
    cs336_systems.stages.<stage>` and its arguments (this process's where `argv` is None)."""
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python3", "-m", f"cs336_systems.stages.{stage}", *args])


def parse_stage_args(
    knobs: type[Knobs],
    argv: list[str] | None,
    description: str,
    own: Callable[[argparse.ArgumentParser], None] | None = None,
    required: Sequence[str] = ("out",),
) -> argparse.Namespace:
    """The arguments of a stage that launches its own workers: the run's own (where its rows go,
    what they say they come from: `add_run_arguments`), the stage's knobs as one value
    (`--block`: its preset block, read as `knobs`), those of a worker (`--worker`, `--result`:
    the rows file rank 0 writes) and the stage's `own` (added by that callback). The launching
    process needs each of `required` (a worker writes no CSV)."""
    ap = argparse.ArgumentParser(description=description)
    add_run_arguments(ap)
    add_block_argument(ap, knobs)
    if own is not None:
        own(ap)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not args.worker and any(not getattr(args, name) for name in required):
        names = " and ".join(f"--{name.replace('_', '-')}" for name in required)
        ap.error(f"{names} {'is' if len(required) == 1 else 'are'} required")
    return args


def worker_argv(args: argparse.Namespace, own: Sequence[str] = (), **changes) -> list[str]:
    """The arguments a worker rank starts with: the stage's `own` (a positional first, then the
    run's flags the workers read), `--worker`, the run's machine, preset and edition, and the
    run's block (`args.block`) with this launch's `changes` (`dataclasses.replace`) as JSON."""
    block = dataclasses.replace(args.block, **changes)
    argv = [*own, "--worker", f"--machine={args.machine}", f"--preset={args.preset}"]
    return [*argv, f"--edition={args.edition}", "--block", block_text(block.as_block())]


def free_port(host: str = "") -> int:
    """A TCP port free on this host now (for rendezvous endpoints that must be named)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        return s.getsockname()[1]


def slurm_first_node(env: dict[str, str] | None = None) -> str:
    """The first host of the SLURM allocation (where the c10d rendezvous lives).

    Under Snakemake the node list may be gone: snakemake-executor-plugin-slurm drops every
    SLURM_* variable but the job id before it runs a rule in the batch script (rules with the
    `mpi` resource, as distributed rules over several nodes are). SLURM runs the batch script on
    the allocation's first node, so that is this host. On the first node this host's own name
    is used, not SLURM's node name: that need not resolve (several slurmd on one host).
    """
    env = dict(os.environ if env is None else env)
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        if not env.get("SLURM_JOB_ID"):
            raise RuntimeError("topology 'slurm' runs inside a SLURM allocation (no SLURM_JOB_ID)")
        return socket.gethostname()
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    first = out.stdout.split()[0]
    return socket.gethostname() if env.get("SLURMD_NODENAME") == first else first


@dataclass(frozen=True)
class Topology:
    """Where the workers run: `nnodes` x `nproc_per_node` processes, `local` or `slurm`."""

    nproc_per_node: int
    nnodes: int = 1
    mode: str = "local"

    def __post_init__(self) -> None:
        if self.mode not in TOPOLOGIES:
            raise ValueError(f"unknown topology {self.mode!r}; known: {TOPOLOGIES}")
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ValueError(f"need nproc_per_node >= 1 and nnodes >= 1, got {self}")
        if self.mode == "local" and self.nnodes != 1:
            raise ValueError("topology 'local' runs on one node; use 'slurm' for several")

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


def worker_command(module: str, args: Sequence[str]) -> list[str]:
    """The command of one rank: `python -m module args`."""
    return [sys.executable, "-m", module, *args]


def rank_env(rank: int, world_size: int, rendezvous: Path) -> dict[str, str]:
    """What torchrun would tell rank `rank` of `world_size` processes on one node, and the
    file the ranks meet at."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_WORLD_SIZE": "1",
        RENDEZVOUS_FILE_ENV: str(rendezvous),
    }


def torchrun_command(
    module: str,
    args: Sequence[str],
    topology: Topology,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
) -> list[str]:
    """The command that starts `python -m module args` on every process of a `slurm` topology:
    `srun` starts one torchrun per node."""
    if topology.mode != "slurm":
        raise ValueError(f"torchrun starts the workers of a slurm topology, not of {topology}")
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    common = [f"--nproc-per-node={topology.nproc_per_node}", "--max-restarts=0"]
    endpoint = rdzv_endpoint or f"{slurm_first_node()}:{free_port()}"
    job = rdzv_id or os.environ.get("SLURM_JOB_ID", "cs336")
    srun = [
        "srun",
        f"--nodes={topology.nnodes}",
        f"--ntasks={topology.nnodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        # over several nodes the rule runs in the batch script (`mpi` resource); where it runs
        # as a step itself (one node), this step must share its resources or wait forever
        "--overlap",
    ]
    rdzv = [
        f"--nnodes={topology.nnodes}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={job}",
    ]
    return [*srun, *torchrun, *rdzv, *common, "-m", module, *args]


def launch_commands(
    module: str, args: Sequence[str], topology: Topology, tmp: Path
) -> list[tuple[list[str], dict[str, str]]]:
    """The processes a launch starts, each a command and its own environment: the ranks
    themselves on one node (`local`, meeting at a file of `tmp`), one srun otherwise."""
    if topology.mode == "slurm":
        return [(torchrun_command(module, args, topology), {})]
    n = topology.nproc_per_node
    rendezvous = tmp / "rendezvous"
    return [(worker_command(module, args), rank_env(r, n, rendezvous)) for r in range(n)]


def worker_env(
    topology: Topology, extra: dict[str, str] | None = None, base: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment of every worker: caller's, the multicast-off settings, then `extra`."""
    env = dict(os.environ if base is None else base)
    env.update(DISTRIBUTED_ENV)
    # as torchrun's agent sets it: a collective that times out aborts its rank
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    # CPU workers share the job's cores (its claim's share, planning/cores.py), a part a rank;
    # torchrun (under SLURM) would otherwise force 1 thread with a warning
    cores = len(usable_cores())
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores // topology.nproc_per_node)))
    # the workers import this package: make sure they find it even without an installed copy
    src = str(Path(__file__).resolve().parents[2])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if src not in paths:
        env["PYTHONPATH"] = os.pathsep.join([src, *paths])
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


@dataclass
class LaunchResult:
    status: str  # ok, or error: <reason> (timeout, exit code)
    returncode: int | None
    elapsed_s: float
    rows: list[dict] = field(default_factory=list)
    log_tail: list[str] = field(default_factory=list)


class Processes:
    """A launch's processes in one process group (a timeout or a failed rank ends all of them),
    their output streamed line by line to our stderr (where the log goes: the rule's log), the
    last `tail_lines` of all of them and of each one kept."""

    def __init__(self, commands: Sequence[tuple[list[str], dict[str, str]]], env, tail_lines: int):
        self.procs: list[subprocess.Popen] = []
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.tails: list[collections.deque[str]] = []
        self._readers: list[threading.Thread] = []
        self._lock = threading.Lock()
        try:
            for cmd, own in commands:
                self._start(cmd, {**env, **own}, tail_lines)
        except BaseException:
            self.end()
            raise

    def _start(self, cmd: list[str], env: dict[str, str], tail_lines: int) -> None:
        # the first leads a process group of its own (0: its pid), the others join it
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            bufsize=1, process_group=self.procs[0].pid if self.procs else 0,
        )  # fmt: skip
        own: collections.deque[str] = collections.deque(maxlen=tail_lines)
        reader = threading.Thread(target=self._pump, args=(proc, own), daemon=True)
        self.procs.append(proc)
        self.tails.append(own)
        self._readers.append(reader)
        reader.start()

    def _pump(self, proc: subprocess.Popen, own: collections.deque[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._lock:
                sys.stderr.write(line)
                sys.stderr.flush()
                self.tail.append(line.rstrip("\n"))
            own.append(line.rstrip("\n"))

    def wait(self, timeout_s: float) -> tuple[str, int | None]:
        """("", 0) once every process ended well; else the status and exit code of the first to
        fail (the others ended then, as torchrun's agent would) or of the timeout. Stopped
        meanwhile (an exception, or a SIGTERM: Snakemake ending the job), it ends them first."""
        deadline = time.monotonic() + timeout_s
        restore = _sigterm_raises()
        try:
            while True:
                codes = [p.poll() for p in self.procs]
                failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
                if failed:
                    self.end()
                    return _exit_reason(codes[failed[0]], self.tails[failed[0]]), codes[failed[0]]
                if all(code == 0 for code in codes):
                    self._join()
                    return "", 0
                if time.monotonic() >= deadline:
                    self.end()
                    return f"error: timeout after {timeout_s:g} s", None
                time.sleep(0.1)
        except BaseException:
            self.end()
            raise
        finally:
            restore()

    def end(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it if some linger; then read what they wrote."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.procs[0].pid, sig)
            except (ProcessLookupError, IndexError):
                break
            if self._ended(grace_s):
                break
        self._join()

    def _ended(self, grace_s: float) -> bool:
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def _join(self) -> None:
        for reader in self._readers:
            reader.join(timeout=10)


def _sigterm_raises() -> Callable[[], Any]:
    """Make a SIGTERM raise SystemExit in this process, so that a launch it stops ends its
    ranks rather than leave them on the cards; returns what puts the handler back (nothing to
    do off the main thread, where no handler can be set)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def launch(
    module: str,
    args: Sequence[str],
    topology: Topology,
    timeout_s: float,
    extra_env: dict[str, str] | None = None,
    tail_lines: int = 400,
) -> LaunchResult:
    """Run `module` on every process of `topology`; rows come from the file passed as
    `--result`.

    The workers' output streams, line by line, to our stderr, their own log lines carrying their
    rank. Never raises for a failed or hung run: the result's status says what happened and its
    rows hold what was written.
    """
    # rank 0 may run on another node than this one: under SLURM its rows file goes to the
    # working directory, which the nodes share
    shared = Path.cwd() if topology.mode == "slurm" else None
    with tempfile.TemporaryDirectory(prefix=".cs336-launch-", dir=shared) as tmp:
        result_path = Path(tmp) / "rows.json"
        argv = [*args, "--result", str(result_path)]
        try:
            commands = launch_commands(module, argv, topology, Path(tmp))
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:  # e.g. no allocation
            log.error("cannot start: %s", exc)
            return LaunchResult(f"error: {exc}"[:160].replace(",", ";"), None, 0.0)
        n = len(commands)
        ranks = f"{n} rank{'s' if n > 1 else ''}: " if topology.mode == "local" else ""
        log.info("%s%s", ranks, shlex.join(commands[0][0]))
        watch = Stopwatch()
        procs = Processes(commands, worker_env(topology, extra_env), tail_lines)
        status, returncode = procs.wait(timeout_s)
        status = status or "ok"
        elapsed = watch.stop()
        rows = read_rows(result_path)
    log.log(
        logging.INFO if status == "ok" else logging.WARNING,
        "%s after %.1f s, %d rows",
        status,
        elapsed,
        len(rows),
    )
    return LaunchResult(status, returncode, elapsed, rows, list(procs.tail))


_EXCEPTION_LINE = re.compile(
    r"^(?:\[rank\d+\]:\s*)?((?:\w+\.)*\w*(?:Error|Exception|Interrupt)): (.*)$"
)


def _exit_reason(returncode: int, lines: Iterable[str]) -> str:
    """`error: <the workers' first exception>` from their output, else the exit code."""
    for line in lines:
        m = _EXCEPTION_LINE.match(line.strip())
        if m and "ChildFailedError" not in m.group(1):
            name = m.group(1).rsplit(".", 1)[-1]
            return f"error: {name}: {m.group(2)}"[:160].replace(",", ";")
    return f"error: exit code {returncode}"


def read_rows(path: Path) -> list[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return []


def fill_missing(
    planned: Sequence[dict], rows: Sequence[dict], keys: Sequence[str], status: str
) -> list[dict]:
    """Rows for every planned point: the workers' row where there is one, else the point with
    `status` (the launch's failure), in the planned order."""
    got = {tuple(r.get(k) for k in keys): r for r in rows}
    out = []
    for point in planned:
        key = tuple(point.get(k) for k in keys)
        out.append(got[key] if key in got else {**point, "status": status})
    return out


# ---- worker side ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: Any  # torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_worker(backend: str, timeout_s: float = 600.0) -> WorkerContext:
    """Join the process group the environment describes (a local launch's or torchrun's;
    NCCL: GPU = local rank)."""
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    pin_rank(local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1")), backend)
    where: dict[str, Any] = {"timeout": timedelta(seconds=timeout_s)}
    if RENDEZVOUS_FILE_ENV in os.environ:  # a local launch: the ranks meet at a file
        where["init_method"] = Path(os.environ[RENDEZVOUS_FILE_ENV]).as_uri()
        where.update(rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group(backend, device_id=device, **where)
    else:
        device = torch.device("cpu")
        dist.init_process_group(backend, **where)
    set_rank(dist.get_rank())  # every log line of this worker names its rank
    return WorkerContext(dist.get_rank(), dist.get_world_size(), local_rank, backend, device)


def pin_rank(local_rank: int, local_world: int, backend: str) -> None:
    """Give this rank its slice of the job's cores, so that the ranks do not contend for them:
    gloo ranks always (their compute and their collectives run on the cores; unpinned, a DDP
    step of two ranks on two cores varied tenfold), NCCL ranks where the job has a share
    of its own (`CS336_CPU_SET`: its cards' NUMA-local cores; an even slice of all the host's
    cores could put a rank far from its card)."""
    import torch

    if local_world < 2 or (backend != "gloo" and CPU_SET_ENV not in os.environ):
        return
    share = rank_share(usable_cores(), local_rank, local_world)
    os.sched_setaffinity(0, share)
    torch.set_num_threads(max(1, len(share)))


def slowest_rank(values: Sequence[float], ctx: WorkerContext) -> list[float]:
    """Element-wise maximum over ranks (e.g. per-iteration times: the slowest rank's)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(list(values), dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def every_rank(value: Any, ctx: WorkerContext) -> list[Any]:
    """`value` (any picklable object) of every rank, in rank order, on every rank."""
    import torch.distributed as dist

    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, value)
    return out


def write_rows(rows: Sequence[dict], path: str | os.PathLike | None, ctx: WorkerContext) -> None:
    """Rank 0 writes all rows so far as JSON, atomically (call after every point)."""
    if path is None or not ctx.is_main:
        return
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(list(rows), f, default=str)
    os.replace(tmp, path)


def finalize_worker() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def feasibility(
    backend: str, world_size: int, nnodes: int = 1, oversubscribe: bool = False
) -> str | None:
    """None when this machine can run `world_size` processes of `backend`, else the reason.
    `oversubscribe`: gloo runs more processes than cores (they take turns on them: a caller
    that times them says so, `oversubscribed`)."""
    per_node = math.ceil(world_size / nnodes)
    if backend == "nccl":
        found = gpu_count()
        if found < max(per_node, 2):
            need = max(world_size, 2)
            return f"skipped: needs {need} GPUs, found {found * nnodes}"
    elif backend == "gloo":
        cores = available_cores()
        if cores < per_node and not oversubscribe:
            return f"skipped: needs {world_size} CPU cores, found {cores * nnodes}"
    else:
        return f"skipped: unknown backend {backend}"
    return None


def oversubscribed(backend: str, world_size: int, nnodes: int = 1) -> bool:
    """More gloo processes on a node than it has cores for: they take turns on the cores."""
    return backend == "gloo" and math.ceil(world_size / nnodes) > available_cores()


def slowest_steps(times: dict[str, list[float]], ctx) -> dict[str, list[float]]:
    """Per step, every part as measured on the rank whose whole step was slowest (so the parts
    of a step add up to its total), gathered from all ranks."""
    import torch
    import torch.distributed as dist

    names = list(times)
    mine = torch.tensor([times[n] for n in names], dtype=torch.float64, device=ctx.device)
    every = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(every, mine)
    stacked = torch.stack(every)  # (rank, part, step)
    slowest = stacked[:, names.index("step"), :].argmax(dim=0)
    picked = stacked[slowest, :, torch.arange(stacked.shape[2])]  # (step, part)
    return {n: picked[:, i].tolist() for i, n in enumerate(names)}


def summarize_slowest(times: dict[str, list[float]], ctx) -> dict:
    from cs336_systems.core.harness import summarize

    if ctx is not None:
        times = slowest_steps(times, ctx)
    row: dict = {}
    for name, values in times.items():
        row.update(summarize(values, name))
    row["comm_share"] = row["comm_ms_mean"] / row["step_ms_mean"]
    return row


def stage_main(stage: str, args, worker, rows, columns_first: list[str]) -> None:
    """The entry point of a stage that launches its own workers (ddp, fsdp, leaderboard): a
    worker process (`--worker`) runs `worker(args)`; the launching process writes the rows
    `rows()` returns, each with the run's provenance (read in a thread while the workers
    start), to `args.out`."""
    from cs336_systems.core.results import provenance_meanwhile, with_columns_first, write_csv
    from cs336_systems.planning.log import configure, get_logger

    configure(stage)
    if args.worker:
        worker(args)
        return
    base = provenance_meanwhile(args.machine, args.preset, args.edition)
    got = rows()
    df = with_columns_first([{**base(), **r} for r in got], columns_first)
    write_csv(df, args.out)
    get_logger(f"cs336_systems.stages.{stage}").info("wrote %s: %d rows", args.out, len(df))
