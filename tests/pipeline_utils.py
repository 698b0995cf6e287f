"""Run the workflow on a copy of the repository in a temp dir and read what Snakemake plans."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
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


def env_for(workdir: Path) -> dict:
    env = dict(os.environ)
    # the copy's package runs, so editing it in a test is what the jobs execute
    env["PYTHONPATH"] = f"{workdir / 'src'}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    return env


def snakemake(
    workdir: Path, *args: str, check: bool = True, timeout: int = 900, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`snakemake --cores 1 ARGS` in `workdir` (a later --cores wins); `env`: the environment
    instead of `env_for(workdir)`."""
    proc = subprocess.run(
        [*SNAKEMAKE, "--cores", "1", *args],
        cwd=workdir,
        env=env if env is not None else env_for(workdir),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
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
    proc = snakemake(workdir, *args)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
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
