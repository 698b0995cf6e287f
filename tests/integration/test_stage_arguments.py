"""Each stage checks its own arguments before it runs anything, and a point that cannot run is
a status row: pytest -k/-m expressions (parsed by pytest's own parser, selection by pytest's
collection), the nsys path, sizes that must fit in memory, the launcher's --env."""

from __future__ import annotations

import argparse
import types

import pandas as pd
import pytest
from pipeline_utils import block, kernel_tests_block

from cs336_systems.stages.allreduce import measure as allreduce
from cs336_systems.stages.ceilings import measure as ceilings
from cs336_systems.stages.ddp import measure as ddp
from cs336_systems.stages.fsdp import measure as fsdp
from cs336_systems.stages.kernel_tests import measure as kernel_tests
from cs336_systems.stages.kernel_tests.plan import expression_problem
from cs336_systems.stages.leaderboard import measure as leaderboard
from cs336_systems.stages.profile import measure as profile


def run_kernel_tests(tmp_path, files, **knobs) -> pd.DataFrame:
    """The stage on `files` (a run argument: the block's files are the kernels' own)."""
    out = tmp_path / "kernel_tests.csv"
    kernel_tests.main(
        ["--files", ",".join(map(str, files)), *kernel_tests_block(**knobs),
         "--junit", str(tmp_path / "j.xml"), "--machine", "m", "--preset", "cpu", "--out", str(out)]
    )  # fmt: skip
    return pd.read_csv(out)


@pytest.mark.parametrize(
    "key,expr", [("select", "not (fp16"), ("select", "a b"), ("marker", "gpu and")]
)
def test_kernel_tests_refuse_a_bad_expression_before_pytest_runs(tmp_path, monkeypatch, key, expr):
    monkeypatch.setattr(kernel_tests, "run_pytest", lambda *a: pytest.fail("pytest ran"))
    test = tmp_path / "test_tiny.py"
    test.write_text("def test_pytorch_one():\n    pass\n")
    df = run_kernel_tests(tmp_path, [test], **{key: expr})
    assert list(df["kernel"]) == ["flash_pytorch", "flash_triton"]
    short = {"select": "-k", "marker": "-m"}[key]
    assert df["status"].str.startswith(f"error: pytest {short} {expr!r}").all(), df["status"][0]
    assert (df["outcome"] == "error").all()


def test_kernel_tests_say_when_the_selection_is_empty(tmp_path):
    test = tmp_path / "test_tiny.py"
    test.write_text("def test_pytorch_one():\n    pass\n")
    df = run_kernel_tests(tmp_path, [test], select="triton")
    assert (df["pytest_exit_code"] == 5).all()
    assert df["status"].str.startswith("skipped: no test of").all()
    assert "selected by -k 'triton'" in df["message"][0]
    # and a selection that matches runs
    df = run_kernel_tests(tmp_path, [test], select="pytorch")
    assert list(df["status"]) == ["ok"] and list(df["kernel"]) == ["flash_pytorch"]


def test_kernel_tests_without_their_test_file(tmp_path):
    df = run_kernel_tests(tmp_path, [tmp_path / "test_gone.py"])
    assert df["status"].str.startswith("error: no test file").all()


def test_pytest_expressions_parse_with_pytests_own_parser():
    assert expression_problem("") is None
    assert expression_problem("not fp16 and not bf16") is None
    assert expression_problem("test_x[1-2]") is None
    assert "column" in expression_problem("not (fp16")
    assert expression_problem("and") is not None


def test_ceilings_skip_sizes_that_cannot_fit_before_allocating(tmp_path, monkeypatch):
    monkeypatch.setattr(ceilings, "copy_point", lambda *a: pytest.fail("allocated"))
    out = tmp_path / "ceilings.csv"
    knobs = block("ceilings", matmul_size=64, matmul_size_of={}, extra_sizes={}, repeats=1, dtypes=["fp32"],
                  copy_mb=2**30, reps=2)  # fmt: skip
    ceilings.main(["--machine", "m", "--preset", "cpu", *knobs, "--out", str(out)])
    df = pd.read_csv(out).set_index("kind")
    assert df.loc["matmul", "status"] == "ok"
    assert df.loc["copy", "status"].startswith("skipped: a copy of 1073741824 MiB needs")
    assert "MiB free on cpu" in df.loc["copy", "status"]


def allreduce_args(sizes_mb: dict, backend: str = "gloo") -> argparse.Namespace:
    run = ["--backend", backend, "--machine", "m", "--preset", "cpu", "--out", "x"]
    return allreduce.parse_args([*run, *block("allreduce", world_sizes=[2], sizes_mb=sizes_mb)])


def test_allreduce_reads_its_knobs_from_one_checked_block(capsys):
    args = allreduce_args({"gloo": [1, 10], "nccl": [2]}, backend="nccl")
    k = args.block
    assert allreduce.sizes_of(args) == [2.0] and k.world_sizes == [2]
    assert allreduce.buffers_of(args) == ["default"]
    assert k.max_seconds_per_size == 1.0 and k.launcher.nnodes == 1 and k.env == {}
    # NCCL's registered buffers are NCCL's only
    run = ["--machine", "m", "--preset", "gpu", "--out", "x"]
    nccl = allreduce.parse_args(["--backend", "nccl", *run, *block("allreduce", "gpu")])
    gloo = allreduce.parse_args(["--backend", "gloo", *run, *block("allreduce", "gpu")])
    assert allreduce.buffers_of(nccl) == ["default", "registered"]
    assert allreduce.buffers_of(gloo) == ["default"]
    with pytest.raises(SystemExit):
        allreduce_args({"gloo": [], "nccl": [1]})
    assert "config: block.sizes_mb.gloo: [] — " in capsys.readouterr().err


def test_allreduce_skips_sizes_that_cannot_fit_and_runs_the_rest(monkeypatch):
    launched = {}

    def fake_launch(module, argv, topo, timeout_s, extra_env):
        launched["argv"] = argv
        rows = [{"buffers": "default", "size_mb": 1.0, "status": "ok"}]
        return types.SimpleNamespace(status="ok", rows=rows)

    monkeypatch.setattr("cs336_systems.parallel.launch.launch", fake_launch)
    monkeypatch.setattr(allreduce, "feasibility", lambda *a, **kw: None)
    args = allreduce_args({"gloo": [1, 2**40], "nccl": [1]})
    rows = {r["size_mb"]: r["status"] for r in allreduce.run_world_size(args, 2)}
    assert rows[1.0] == "ok"
    assert rows[2.0**40].startswith("skipped: 1.09951e+12 MiB x 3 buffers x 2 ranks needs")
    # the workers get the same block, with the sizes that fit
    worker = allreduce.parse_args(launched["argv"])
    assert worker.worker and allreduce.sizes_of(worker) == [1.0]
    assert worker.block.sizes_mb.nccl == [1] and worker.backend == "gloo"
    assert worker.block.warmup == args.block.warmup and allreduce.buffers_of(worker) == ["default"]


def test_allreduce_launches_nothing_when_no_size_fits(monkeypatch):
    monkeypatch.setattr("cs336_systems.parallel.launch.launch", lambda *a, **k: pytest.fail())
    monkeypatch.setattr(allreduce, "feasibility", lambda *a, **kw: None)
    (row,) = allreduce.run_world_size(allreduce_args({"gloo": [2**40], "nccl": [1]}), 2)
    assert row["status"].startswith("skipped:")


def launched_argv(monkeypatch, status: str | None = None) -> list[list[str]]:
    """The argv of every worker launch from now on (none runs: no rows come back), the
    machine's feasibility `status` (None: it can run the job)."""
    from cs336_systems.parallel import launch

    launched = []

    def fake_launch(module, argv, topology, **kw):
        launched.append(argv)
        return launch.LaunchResult("ok", 0, 0.0, [])

    monkeypatch.setattr(launch, "launch", fake_launch)
    monkeypatch.setattr(launch, "feasibility", lambda *a, **kw: status)
    return launched


def test_ddp_reads_its_knobs_from_one_checked_block(capsys, monkeypatch):
    run = ["--machine", "m", "--preset", "cpu", "--out", "x"]
    args = ddp.parse_args(["variants", *run, *block("ddp", bucket_sizes_mb=[2, 50])])
    k = args.block
    assert k.bucket_sizes_mb == [2.0, 50.0] and k.world_size == 2
    assert k.warmup_steps == 1 and k.measure_steps == 3 and k.launcher.nnodes == 1
    assert ddp.variants_of(args) == list(k.variants)
    # the sharding job profiles nothing; a worker gets the same block
    assert not ddp.profiled(ddp.parse_args(["sharding", *run, *block("ddp", profile=True)]))
    launched = launched_argv(monkeypatch)
    ddp.run(args)
    assert ddp.parse_args(launched[-1]).block == args.block
    # the compute-only baseline alone, where DDP cannot run: its worker runs no variant (the
    # block keeps its valid list: an empty one is refused)
    launched = launched_argv(monkeypatch, "skipped: needs 2 CPU cores, found 1")
    ddp.run(args)
    only = ddp.parse_args(launched[-1])
    assert only.worker and only.only_baseline and ddp.variants_of(only) == []
    assert only.block.variants == args.block.variants and not ddp.profiled(only)
    # a block the schema refuses is refused with the workflow's problem line
    with pytest.raises(SystemExit):
        ddp.parse_args(["variants", *run, *block("ddp", variants=[])])
    assert "config: block.variants: [] — " in capsys.readouterr().err


def test_fsdp_reads_its_knobs_from_one_checked_block(capsys, monkeypatch):
    run = ["--machine", "m", "--preset", "cpu", "--out", "x"]
    args = fsdp.parse_args([*run, *block("fsdp", env={"A": 1}, profile=False)])
    k = args.block
    assert k.backend == "gloo" and k.warmup_steps == 1 and k.measure_steps == 2
    assert k.env == {"A": 1} and not k.profile and k.timeout_s == 300.0
    assert k.variants[0] == "ddp" and set(k.variants) <= set(fsdp.VARIANTS)
    # a worker gets the same block
    launched = launched_argv(monkeypatch)
    fsdp.run(args)
    assert fsdp.parse_args(launched[-1]).block == args.block
    with pytest.raises(SystemExit):
        fsdp.parse_args([*run, *block("fsdp", variants=["zero3"])])
    assert "config: block.variants[0]: 'zero3' — " in capsys.readouterr().err


def test_leaderboard_reads_its_knobs_from_one_checked_block(capsys, tmp_path, monkeypatch):
    run = ["--machine", "m", "--preset", "cpu", "--out", "x"]
    knobs = block("leaderboard", reduced_layers=3, env={"A": True})
    args = leaderboard.parse_args([*run, "--plans", "full,reduced", *knobs])
    k = args.block
    assert (k.backend, k.world_size, k.d_model, k.num_layers) == ("gloo", 2, 64, 2)
    assert k.reduced_layers == 3 and k.env == {"A": True} and args.pinned == ""
    assert k.ablations[0] == "sdpa" and not k.compile and k.profile
    # the ablation job pins the engine row's checkpointing; its workers get the same block
    runs = tmp_path / "runs.csv"
    runs.write_text("config,variant,status,checkpointing\nfull,engine,ok,sqrt\n")
    ablation = leaderboard.parse_args(
        [*run, "--plans", "ablation", "--checkpoint-from", str(runs), *knobs]
    )
    launched = launched_argv(monkeypatch)
    leaderboard.run(ablation)
    worker = leaderboard.parse_args(launched[-1])
    assert worker.block == args.block and worker.pinned == "sqrt" and worker.config == "ablation"
    with pytest.raises(SystemExit):
        leaderboard.parse_args([*run, "--plans", "full", *block("leaderboard", checkpoint="x")])
    assert "config: block.checkpoint: 'x' — auto (by memory)" in capsys.readouterr().err


def test_profile_says_when_the_configured_nsys_is_not_there():
    profiler, note = profile.choose_profiler("auto", "/no/such/nsys", cuda=True)
    assert profiler == profile.PROFILER_TORCH_CUDA
    assert note == "nsys '/no/such/nsys' (config `nsys`) is not an executable"
    # a name on PATH counts: `true` stands in for an nsys here
    assert profile.choose_profiler("auto", "true", cuda=True)[0] == profile.PROFILER_NSYS
