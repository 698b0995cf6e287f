"""Run the workflow on a copy of the repository in a temp dir and read what Snakemake plans."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def block(
    stage: str, preset: str = "cpu", edition: int | None = None, part=None, **changes
) -> list[str]:
    """`--block <json>` of a stage CLI: its preset block of config/stages/<stage>.yaml, merged
    with its `editions` entry for `edition` (default the current one), with `changes`, and
    narrowed to a job's `part` (a `Knobs.part` class) where given (as the workflow's rules pass
    it)."""
    from cs336_systems.planning.edition import DEFAULT_EDITION, edition_overrides

    blocks = yaml.safe_load((ROOT / f"config/stages/{stage}.yaml").read_text())[stage]
    edition_overrides({stage: blocks}, [stage], edition or DEFAULT_EDITION)
    chosen = {**blocks[preset], **changes}
    return ["--block", json.dumps(part.select(chosen) if part else chosen)]


def kernel_tests_block(**changes) -> list[str]:
    """`--block` of the kernel_tests stage as tests run it on their own files (`--files`): two
    kernels, every test selected, one worker; `changes` on top."""
    kernels = {"flash_pytorch": "^test_pytorch_", "flash_triton": "^test_triton_"}
    knobs = {"kernels": kernels, "select": "", "marker": "", "timeout_s": 1800, "workers": 1}
    return block("kernel_tests", **{**knobs, **changes})


def kernel_test_files() -> list[str]:
    """The kernel_tests stage's test files: its config checks that they exist."""
    blocks = yaml.safe_load((ROOT / "config/stages/kernel_tests.yaml").read_text())
    return sorted({f for block in blocks["kernel_tests"].values() for f in block["files"]})


COPIED = [
    "Snakefile",
    "workflow",
    "config",
    "profiles",
    "src",
    "report/templates",
    "tests/data",
    "tests/conftest.py",
    *kernel_test_files(),
]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def copy_workflow(dest: Path) -> Path:
    for item in COPIED:
        src = ROOT / item
        target = dest / item
        if src.is_dir():
            shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


# the finished run several test files read: the ceilings and benchmark stages on the tiny config
TINY_RUN = [
    "--configfile",
    "tests/data/tiny_config.yaml",
    "--config",
    "stages=[ceilings,benchmark]",
]


def built_once(folder: Path, build, step: str = "done") -> Path:
    """`folder` once `build(folder)` brought it to `step` (a marker file beside it), unless a
    process of this test session already did: pytest-xdist's workers share it (a lock beside
    it; the first to ask builds, the others wait). A failed build leaves nothing behind, its
    folder and markers, so the next to ask starts again."""
    done = folder.with_name(f"{folder.name}.{step}")
    with open(folder.with_name(f"{folder.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            try:
                build(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                for marker in folder.parent.glob(f"{folder.name}.*"):
                    if marker.suffix != ".lock":
                        marker.unlink()
                raise
            done.touch()
    return folder


def copy_run(run: Path, dest: Path) -> Path:
    """A finished run copied to `dest` with its files' times and Snakemake's records: nothing
    to do there either, and edits there leave `run` as it was."""
    shutil.copytree(run, dest, symlinks=True)
    return dest


def env_for(workdir: Path) -> dict:
    env = dict(os.environ)
    # the copy's package runs, so editing it in a test is what the jobs execute
    env["PYTHONPATH"] = f"{workdir / 'src'}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    return env


# `python -m snakemake` spends about 0.75 s of its 1.2 s on a dry run importing Snakemake (its
# plugins, pandas). This process imports it once and forks a child per call that is then the
# process `python -m snakemake ARGS` would be: the call's directory, environment, sys.path
# (the directory, then PYTHONPATH) and argv, its output in files, its exit status; nothing of
# the package or the workflow is loaded before the fork. What differs: one PYTHONHASHSEED for
# all the calls of a test process (set and dict orders repeat from call to call). Timings
# (timed_snakemake) start a fresh process instead: they measure what a user's command costs.
FORKED_SNAKEMAKE = r"""
import atexit, importlib, importlib.util, json, os, sys, traceback

import snakemake.cli  # what snakemake/__main__.py imports
import snakemake.workflow

MAIN = importlib.util.find_spec("snakemake.__main__").origin  # argv[0] of `python -m snakemake`
SITE = sys.path[1:]  # without -c's ''


def child(call):
    os.chdir(call["cwd"])
    snakemake.workflow.Workflow._rundir = os.getcwd()  # read at import: "Run directory"
    os.environ.clear()
    os.environ.update(call["env"])
    extra = call["env"].get("PYTHONPATH", "")
    extra = [p or os.getcwd() for p in extra.split(os.pathsep)] if extra else []
    sys.path[:] = [os.getcwd(), *extra, *SITE]
    importlib.invalidate_caches()
    sys.argv = [MAIN, *call["args"]]
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                            (1, call["out"], os.O_WRONLY | os.O_TRUNC),
                            (2, call["err"], os.O_WRONLY | os.O_TRUNC)):
        os.dup2(os.open(path, flags), fd)
    code = 0
    try:
        snakemake.cli.main(call["args"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


for line in sys.stdin:
    call = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        child(call)
    print(json.dumps({"pid": pid}), flush=True)
    _, status, usage = os.wait4(pid, 0)
    cpu = usage.ru_utime + usage.ru_stime  # the call's, with the jobs it waited for
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status), "cpu": cpu}), flush=True)
"""


class _ForkedSnakemake:
    """The process that forks Snakemake for every call (FORKED_SNAKEMAKE), started at the first
    call of this process; it ends when this process closes its input."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.cpu = 0.0  # CPU seconds of the calls so far (user + system)

    def _start(self) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        proc = subprocess.Popen(
            [sys.executable, "-c", FORKED_SNAKEMAKE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        atexit.register(self._stop, proc)
        return proc

    @staticmethod
    def _stop(proc: subprocess.Popen) -> None:
        """End of input: it exits; waiting for it adds its CPU time to this process's children."""
        proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)

    def run(self, args: list[str], cwd: Path, env: dict, timeout: float):
        with self.lock, tempfile.TemporaryDirectory(prefix="snakemake-") as tmp:
            if self.proc is None or self.proc.poll() is not None:
                self.proc = self._start()
            out, err = Path(tmp, "out"), Path(tmp, "err")
            out.touch()
            err.touch()
            call = {"args": args, "cwd": str(cwd), "env": env, "out": str(out), "err": str(err)}
            self.proc.stdin.write(json.dumps(call) + "\n")
            self.proc.stdin.flush()
            pid = json.loads(self.proc.stdout.readline())["pid"]
            fired = threading.Event()

            def kill() -> None:
                fired.set()
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

            timer = threading.Timer(timeout, kill)
            timer.start()
            try:
                reply = self.proc.stdout.readline()
            finally:
                timer.cancel()
            if not reply:  # the forking process died: a fresh one next time
                raise RuntimeError("the process that forks Snakemake ended")
            cmd = [*SNAKEMAKE, *args]
            texts = [p.read_text(errors="replace") for p in (out, err)]
            reply = json.loads(reply)
            self.cpu += reply["cpu"]
            if fired.is_set():
                raise subprocess.TimeoutExpired(cmd, timeout, *texts)
            return subprocess.CompletedProcess(cmd, reply["rc"], *texts)


_FORKED = _ForkedSnakemake()


def snakemake(
    workdir: Path, *args: str, check: bool = True, timeout: int = 900, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`snakemake --cores 1 ARGS` in `workdir` (a later --cores wins), as `python -m snakemake`
    in a process of its own (forked: FORKED_SNAKEMAKE, unless `env` sets what Python reads at
    its start differently); `env`: the environment instead of `env_for(workdir)`."""
    env = env if env is not None else env_for(workdir)
    startup = {k for k in [*env, *os.environ] if k.startswith("PYTHON") and k != "PYTHONPATH"}
    if any(env.get(k) != os.environ.get(k) for k in startup):
        proc = subprocess.run(
            [*SNAKEMAKE, "--cores", "1", *args],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    else:
        proc = _FORKED.run(["--cores", "1", *args], cwd=workdir, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return proc


def timed_snakemake(workdir: Path, *args: str) -> tuple[subprocess.CompletedProcess, float, float]:
    """(process, wall seconds, CPU seconds). The CPU time (user + system of Snakemake and what
    it waited for) is what planning costs on an idle machine: on a shared one the wall time
    adds the time others' processes held the cores."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(  # a fresh process, not a fork: its start is part of the cost
        [*SNAKEMAKE, "--cores", "1", *args],
        cwd=workdir,
        env=env_for(workdir),
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise AssertionError(
            f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return proc, wall, cpu


def planned_jobs(workdir: Path, *args: str) -> Counter:
    """The jobs a dry run would execute, as {rule: count} (without the `all` target)."""
    proc = snakemake(workdir, "--dry-run", *args)
    out = proc.stdout + proc.stderr
    if "Nothing to be done" in out:
        return Counter()
    stats = out.split("Job stats:", 1)[1]
    jobs = Counter()
    for line in stats.splitlines()[3:]:
        m = re.match(r"^(\S+)\s+(\d+)$", line.strip())
        if not m:
            break
        if m.group(1) not in ("total", "all"):
            jobs[m.group(1)] = int(m.group(2))
    return jobs
