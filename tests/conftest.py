"""Test set-up: Triton runs in its interpreter on machines without CUDA, GPU tests skip there;
the whole suite on pytest-xdist's workers, the long files first; the finished tiny run that
several files read, built once per session."""

import os
import shutil
import time
from pathlib import Path

import pytest

try:
    import torch

    HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    HAS_CUDA = False

if not HAS_CUDA:
    # must be set before triton is imported anywhere: kernels then run on CPU tensors
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files keep order
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# ---- running the suite in parallel (pytest-xdist) ---------------------------------------------

# workers: one per core and one more, for the SLURM tests' worker mostly waits for the cluster
MAX_WORKERS = 8


def whole_suite(config) -> bool:
    """The run names a folder (`uv run pytest`: testpaths), not test files."""
    here = config.invocation_params.dir
    return any((here / arg.split("::")[0]).is_dir() for arg in config.args)


@pytest.hookimpl(wrapper=True)
def pytest_cmdline_main(config):
    """The whole suite (`uv run pytest`, or a folder) runs on pytest-xdist's workers, a file or
    a test in this process (its prints, --pdb, -s), unless `-n` says otherwise (`-n0`: no
    workers) or xdist is off (`-p no:xdist`). The suite's workers take a file each (`--dist
    loadfile`, unless --dist says otherwise), so module fixtures (the SLURM cluster's runs, the
    pipeline copies) are made once, the long files first (LONG_FIRST). Runs before xdist's own
    hook, which reads it. Not in pyproject's addopts: the kernel_tests stage runs pytest on
    test files of the repository too, with its own `-n`."""
    opt = config.option
    if hasattr(opt, "numprocesses") and whole_suite(config) and not hasattr(config, "workerinput"):
        if opt.numprocesses is None and not opt.usepdb and opt.capture != "no":
            opt.numprocesses = min((os.cpu_count() or 1) + 1, MAX_WORKERS)
        if opt.numprocesses and opt.dist == "no":
            opt.dist = "loadfile"
            opt.loadscopereorder = False
    return (yield)


# Files that take longest, started first: under `--dist loadfile` a file is one worker's unit,
# and the SLURM tests (minutes, mostly waiting for the cluster) must not be the last to start.
# The rest keep their order.
LONG_FIRST = [
    "test_slurm.py",
    "test_figures.py",
    "test_claim.py",
    "test_pipeline.py",
    "test_own_model_pipeline.py",
    "test_benchmark.py",
    "test_grids_2026.py",
    "test_flash_attention.py",
    "test_planning_speed.py",
    "test_flash_programs.py",
    "test_memory.py",
    "test_checkpointing_own_model.py",
    "test_ddp.py",
    "test_allreduce.py",
    "test_fsdp_stage.py",
    "test_attention.py",
    "test_layout.py",
    "test_engine_step_script.py",
    "test_readme.py",
]


# ---- the finished tiny run ----------------------------------------------------------------------


# targets that make the finished tiny run's jobs that time something (ceilings, benchmark and
# its warm-up, as rules without wildcards: their aggregates); the rest (figures, the report)
# read what they wrote. Not `--until ceilings benchmark benchmark_warmup`: on a fresh copy
# Snakemake then finds the report's code stamp missing under some PYTHONHASHSEEDs.
TINY_MEASURING = ["ceilings", "benchmark_aggregate", "benchmark_warmup_aggregate"]


def make_finished_tiny_run(shared: Path, measured_only: bool = False) -> Path:
    """<shared>/finished_tiny_run: the ceilings and benchmark stages on the tiny config
    (pipeline_utils.TINY_RUN) in a copy of the workflow, made once for every process of the
    session that asks (pipeline_utils.built_once); `measured_only`: its measuring jobs only
    (TINY_MEASURING), the rest made by the next to ask for all of it."""
    from pipeline_utils import TINY_RUN, built_once, copy_workflow, snakemake

    folder = shared / "finished_tiny_run"
    measured = folder.with_name(f"{folder.name}.measured")

    def build(folder: Path) -> None:
        if measured.exists():  # the rest of the run
            snakemake(folder, *TINY_RUN)
            return
        shutil.rmtree(folder, ignore_errors=True)
        targets = TINY_MEASURING if measured_only else []  # before --config's values
        snakemake(copy_workflow(folder), *targets, *TINY_RUN)
        measured.touch()

    return built_once(folder, build, "measured" if measured_only else "done")


def selects_unmarked(markexpr: str) -> bool:
    """Whether `-m markexpr` keeps a test without markers (as test_pipeline.py's are)."""
    if not markexpr:
        return True
    try:
        from _pytest.mark.expression import Expression

        return Expression.compile(markexpr).evaluate(lambda name, **kwargs: False)
    except Exception:  # pytest's own module moved: make the run, as for the whole suite
        return True


def pytest_sessionstart(session):
    """Under pytest-xdist the controller makes the finished tiny run's measurements before the
    workers start (xdist starts them after this hook): its jobs time steps of milliseconds,
    which tests running beside them would stretch into suspect rows, and test_pipeline.py reads
    the report those rows leave out; the first test to ask makes the rest of the run. One job
    at a time: two at once on a 2-core machine left a context's timings out of order about
    every other run. Only for a folder (the suite) where test_pipeline.py's unmarked tests stay
    selected: where a selection (test files, -k, `-m gpu`) may not need it, or this fails, the
    fixture below makes it when a test asks."""
    config = session.config
    factory = getattr(config, "_tmp_path_factory", None)
    if (
        hasattr(config, "workerinput")
        or not getattr(config.option, "numprocesses", None)
        or not whole_suite(config)
        or config.option.collectonly
        or config.option.keyword
        or not selects_unmarked(config.option.markexpr)
        or factory is None
    ):
        return
    t0 = time.monotonic()
    try:
        make_finished_tiny_run(factory.getbasetemp(), measured_only=True)
    except Exception as exc:  # the fixture tries again and fails the tests that need it
        print(f"\nthe tiny run's measurements failed before the workers started: {exc}")
        return
    print(f"\nthe tiny run's measurements, before the workers: {time.monotonic() - t0:.0f} s")


@pytest.fixture(scope="session")
def finished_tiny_run(tmp_path_factory) -> Path:
    """The finished tiny run (make_finished_tiny_run), made once per test session: by the
    xdist controller before its workers start, else by the first process that asks, in the
    session's shared temp folder. Read it only; a test that edits or reruns works on its own
    copy (pipeline_utils.copy_run)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the workers' temp folders sit in the controller's
    return make_finished_tiny_run(shared)
