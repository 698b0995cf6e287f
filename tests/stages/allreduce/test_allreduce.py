"""All-reduce benchmark arithmetic and correctness check; the launcher end to end."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from pipeline_utils import ROOT, block

from cs336_systems.parallel import launch
from cs336_systems.stages.allreduce import measure as ar

SRC = str(Path(ar.__file__).resolve().parents[3])


def test_bandwidth_arithmetic():
    gib = 2**30
    assert ar.algbw_gbps(gib, 1.0) == pytest.approx(gib / 1e-3 / 1e9)
    assert ar.busbw_factor(2) == 1.0
    assert ar.busbw_factor(4) == 1.5
    assert ar.busbw_factor(6) == pytest.approx(10 / 6)
    for n in (2, 4, 6):  # nccl-tests: busbw = algbw * 2 (n - 1) / n
        assert ar.busbw_gbps(10 * 2**20, 2.5, n) == pytest.approx(
            ar.algbw_gbps(10 * 2**20, 2.5) * 2 * (n - 1) / n
        )
    assert ar.message_numel(1) == 2**18  # float32, MB = 2**20 bytes
    assert ar.algbw_gbps(1024, 0.0) != ar.algbw_gbps(1024, 0.0)  # NaN, not a division error


def test_check_sum_detects_wrong_results():
    base = torch.rand(1000) + 0.5
    n = 4
    right = sum(base * (r + 1) for r in range(n))
    assert ar.check_sum(right, base, n)[0]
    assert not ar.check_sum(right - base, base, n)[0]  # one rank missing
    wrong = right.clone()
    wrong[17] *= 1.001
    ok, err = ar.check_sum(wrong, base, n)
    assert not ok and err == pytest.approx(1e-3, rel=1e-2)


def test_feasibility(monkeypatch):
    monkeypatch.setattr(launch, "gpu_count", lambda: 1)
    monkeypatch.setattr(launch, "available_cores", lambda: 2)
    assert launch.feasibility("nccl", 2) == "skipped: needs 2 GPUs, found 1"
    assert launch.feasibility("gloo", 2) is None
    assert launch.feasibility("gloo", 6) == "skipped: needs 6 CPU cores, found 2"
    # the all-reduce stage runs gloo at any world size, the processes taking turns on the cores
    assert launch.feasibility("gloo", 6, oversubscribe=True) is None
    assert launch.oversubscribed("gloo", 6) and not launch.oversubscribed("gloo", 2)
    assert not launch.oversubscribed("nccl", 6)
    monkeypatch.setattr(launch, "gpu_count", lambda: 2)
    assert launch.feasibility("nccl", 2) is None
    assert launch.feasibility("nccl", 4) == "skipped: needs 4 GPUs, found 2"


def test_skipped_nccl_rows_keep_the_hosts_cores(monkeypatch):
    """NCCL rows record the host's cores as gloo rows do (they once left the column empty)."""
    import cs336_systems.core.device as device

    monkeypatch.setattr(launch, "gpu_count", lambda: 0)
    monkeypatch.setattr(device, "available_cores", lambda: 3)
    knobs = block("allreduce", world_sizes=[2], sizes_mb={"gloo": [1], "nccl": [1, 10]})
    args = ar.parse_args(
        ["--backend", "nccl", "--machine", "m", "--preset", "cpu", *knobs, "--out", "unused.csv"]
    )
    rows = ar.run_world_size(args, 2)
    assert [r["status"] for r in rows] == ["skipped: needs 2 GPUs, found 0"] * 2
    assert [r["cpu_cores"] for r in rows] == [3, 3]
    assert all("--backend=nccl" in r["command"] for r in rows)


def test_commands_and_environment(monkeypatch):
    local = launch.launch_commands("m", ["--x"], launch.Topology(3), Path("/t"))
    assert [cmd for cmd, _ in local] == [[sys.executable, "-m", "m", "--x"]] * 3
    assert [env["RANK"] for _, env in local] == ["0", "1", "2"]
    assert [env["LOCAL_RANK"] for _, env in local] == ["0", "1", "2"]
    assert (
        {env["WORLD_SIZE"] for _, env in local}
        == {"3"}
        == {e["LOCAL_WORLD_SIZE"] for _, e in local}
    )
    assert {env[launch.RENDEZVOUS_FILE_ENV] for _, env in local} == {"/t/rendezvous"}
    with pytest.raises(ValueError):
        launch.torchrun_command("m", [], launch.Topology(2))  # one node needs no torchrun
    slurm = launch.torchrun_command(
        "m", [], launch.Topology(4, nnodes=2, mode="slurm"), rdzv_endpoint="node1:29400"
    )
    assert slurm[0] == "srun" and "--ntasks-per-node=1" in slurm
    for flag in ("--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d"):
        assert flag in slurm
    assert "--rdzv-endpoint=node1:29400" in slurm and "--standalone" not in slurm
    assert slurm[-2:] == ["-m", "m"]  # torchrun runs the module with its own interpreter
    with pytest.raises(ValueError):
        launch.Topology(2, nnodes=2)  # several nodes need the slurm topology
    env = launch.worker_env(
        launch.Topology(2), {"NCCL_DEBUG": "WARN"}, base={"NCCL_NVLS_ENABLE": "1"}
    )
    assert env["NCCL_NVLS_ENABLE"] == "0"  # multicast off even when the caller had it on
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert env["NCCL_DEBUG"] == "WARN"
    assert SRC in env["PYTHONPATH"].split(os.pathsep)


def test_fill_missing_keeps_order_and_reason():
    planned = [{"size_mb": 1.0}, {"size_mb": 10.0}]
    rows = [{"size_mb": 10.0, "status": "ok", "time_ms_median": 1.0}]
    out = launch.fill_missing(planned, rows, ["size_mb"], "error: timeout after 5 s")
    assert out == [{"size_mb": 1.0, "status": "error: timeout after 5 s"}, rows[0]]
    assert launch.free_port() > 0


@pytest.mark.slow
def test_gloo_allreduce_end_to_end(monkeypatch):
    """Two gloo processes through the launcher: checked sums, sane bandwidths; on one core they
    still run, marked oversubscribed."""
    import cs336_systems.core.device as device

    monkeypatch.setattr(launch, "available_cores", lambda: 1)
    monkeypatch.setattr(device, "available_cores", lambda: 1)
    knobs = block(
        "allreduce", world_sizes=[2], sizes_mb={"gloo": [0.0625, 0.5], "nccl": [1]},
        warmup=2, repeats=5, min_repeats=2, max_seconds_per_size=0.5, timeout_s=240,
    )  # fmt: skip
    args = ar.parse_args(
        ["--backend", "gloo", "--machine", "m", "--preset", "cpu", *knobs, "--out", "unused.csv"]
    )
    rows = [r for n in args.block.world_sizes for r in ar.run_world_size(args, n)]
    by_ws = {2: rows}
    assert [r["status"] for r in by_ws[2]] == ["ok", "ok"], by_ws[2]
    assert all(r["oversubscribed"] and r["cpu_cores"] == 1 and not r["command"] for r in rows)
    for r in by_ws[2]:
        assert r["max_rel_err"] < 1e-6
        assert r["bytes"] == int(r["size_mb"] * 2**20)
        assert r["time_ms_median"] > 0 and r["repeats"] >= 2
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"])  # n = 2: factor 1
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / r["time_ms_median"] / 1e6)


HANG_WORKER = """
import time
time.sleep(600)
"""


@pytest.mark.slow
def test_launcher_turns_a_hang_into_a_status(tmp_path):
    (tmp_path / "hang_worker.py").write_text(HANG_WORKER)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), SRC])}
    result = launch.launch("hang_worker", [], launch.Topology(2), timeout_s=2, extra_env=env)
    assert result.status == "error: timeout after 2 s"
    assert result.elapsed_s < 30
    assert result.rows == []
    planned = [{"size_mb": 1.0}]
    assert launch.fill_missing(planned, result.rows, ["size_mb"], result.status) == [
        {"size_mb": 1.0, "status": "error: timeout after 2 s"}
    ]


FAILING_WORKER = """
import os, sys, time
if os.environ["RANK"] == "1":
    sys.exit("ValueError: rank 1 gives up")
print("rank 0 waits for rank 1", flush=True)
time.sleep(600)
"""


def test_launcher_ends_the_ranks_when_one_fails(tmp_path):
    """As torchrun's agent would: a failed rank ends the launch and the others with it."""
    (tmp_path / "failing_worker.py").write_text(FAILING_WORKER)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), SRC])}
    result = launch.launch("failing_worker", [], launch.Topology(2), timeout_s=60, extra_env=env)
    assert result.status == "error: ValueError: rank 1 gives up"
    assert result.returncode == 1
    assert result.elapsed_s < 20  # rank 0 was ended, not waited for
    assert "rank 0 waits for rank 1" in result.log_tail


PIN_WORKER = """
import os, pathlib, sys
import torch
from cs336_systems.parallel import launch
ctx = launch.init_worker(sys.argv[1], timeout_s=60)
cores = ",".join(map(str, sorted(os.sched_getaffinity(0))))
pathlib.Path(sys.argv[2], str(ctx.rank)).write_text(f"{cores} {torch.get_num_threads()}")
"""


@pytest.mark.slow
def test_gloo_ranks_get_cores_of_their_own(tmp_path):
    """Each gloo rank of a local launch runs on its own slice of the job's cores, its thread
    pool sized to it (unpinned, two ranks on two cores took turns and stalled)."""
    (tmp_path / "pin_worker.py").write_text(PIN_WORKER)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), SRC])}
    result = launch.launch(
        "pin_worker", ["gloo", str(tmp_path)], launch.Topology(2), timeout_s=120, extra_env=env
    )
    assert result.status == "ok", result.log_tail
    seen = {r: (tmp_path / str(r)).read_text().split() for r in (0, 1)}
    job = sorted(os.sched_getaffinity(0))
    shares = [[int(c) for c in seen[r][0].split(",")] for r in (0, 1)]
    if len(job) >= 2:
        per = len(job) // 2
        assert shares == [job[:per], job[per : 2 * per]]
        assert [int(seen[r][1]) for r in (0, 1)] == [per, per]
    else:
        assert shares == [job, job]


def test_nccl_ranks_stay_unpinned_without_a_share(monkeypatch):
    """Without the claim's share (its cards' NUMA-local cores) an NCCL rank keeps the job's
    cores: an even slice of the host's could lie far from its card."""
    pinned = []
    monkeypatch.delenv(launch.CPU_SET_ENV, raising=False)
    monkeypatch.setattr(launch.os, "sched_setaffinity", lambda pid, cores: pinned.append(cores))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(launch, "usable_cores", lambda: [0, 1, 2, 3])
    launch.pin_rank(1, 2, "nccl")
    launch.pin_rank(0, 1, "gloo")  # a single rank keeps every core
    assert pinned == []
    monkeypatch.setenv(launch.CPU_SET_ENV, "0-3")
    launch.pin_rank(1, 2, "nccl")
    launch.pin_rank(1, 2, "gloo")
    assert pinned == [[2, 3], [2, 3]]


PID_WORKER = """
import os, pathlib, sys, time
pathlib.Path(sys.argv[1], os.environ["RANK"]).write_text(str(os.getpid()))
time.sleep(600)
"""
LAUNCHER = """
import sys
from cs336_systems.parallel import launch
launch.launch("pid_worker", [sys.argv[1]], launch.Topology(2), timeout_s=600)
"""


def test_a_stopped_launch_ends_its_ranks(tmp_path):
    """Snakemake ends a job with SIGTERM: the launching process ends its ranks before it exits,
    rather than leave them running on the job's cards."""
    import signal
    import subprocess
    import time

    (tmp_path / "pid_worker.py").write_text(PID_WORKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), SRC])}
    parent = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)], env=env)
    pids = [tmp_path / "0", tmp_path / "1"]
    deadline = time.monotonic() + 60
    while not all(p.exists() and p.read_text() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    ranks = [int(p.read_text()) for p in pids]
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=30) == 128 + signal.SIGTERM
    for pid in ranks:  # ended (and reaped by the launcher): no such process any more
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_crash_reason_from_worker_output():
    lines = [
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "x.py", line 3, in <module>',
        "[rank1]: ValueError: boom, from the worker",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "Root Cause (first observed failure):",
    ]
    assert launch._exit_reason(1, lines) == "error: ValueError: boom; from the worker"
    oom = ["[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]
    assert launch._exit_reason(1, oom).startswith("error: OutOfMemoryError: CUDA out of memory")
    assert launch._exit_reason(-9, ["Killed"]) == "error: exit code -9"


def test_latency_bandwidth_fit():
    import pandas as pd

    from cs336_systems.reporting.analysis import fit_latency_bandwidth

    o, w = 20e-6, 100e9  # 20 us per call, 100 GB/s
    sizes = [2**20, 10 * 2**20, 100 * 2**20, 2**30]
    df = pd.DataFrame(
        {
            "backend": "nccl",
            "buffers": "default",
            "world_size": 2,
            "bytes": sizes,
            "time_ms_median": [(o + b / w) * 1e3 for b in sizes],
            "status": "ok",
        }
    )
    fit = fit_latency_bandwidth(df).iloc[0]
    assert fit["latency_us"] == pytest.approx(20, rel=1e-6)
    assert fit["bandwidth_gbps"] == pytest.approx(100, rel=1e-6)


def test_report_of_a_machine_where_no_point_ran(tmp_path):
    """Every NCCL point skipped for want of GPUs: the section counts them by kind (each reason
    is in its table) and its method paragraph has no dangling checked-error clause."""
    import pandas as pd
    from fixture_rows import prov, write_results

    from cs336_systems.reporting import report

    rows = pd.DataFrame(
        [
            {
                **prov(gpus=1),
                "backend": "nccl",
                "buffers": "default",
                "world_size": n,
                "size_mb": 1.0,
                "status": f"skipped: needs {n} GPUs, found 1",
            }  # fmt: skip
            for n in (2, 4, 6)
        ]
    )
    results = write_results(tmp_path / "results" / "fixture", allreduce=rows)
    section = report.render(results, ["allreduce"]).split('<a id="allreduce"></a>', 1)[1]
    assert "0 of 3 points ran (3 skipped)." in section
    assert "before any timing. One sample is a few" in section and ". ;" not in section
    assert "| nccl      | default   |            6 |" in section  # the reasons' table


def test_the_size_sentence_follows_the_curve():
    import pandas as pd

    from cs336_systems.stages.allreduce import answers

    h = pd.DataFrame({"size_mb": [1.0, 10.0, 100.0], "busbw_gbps": [0.81, 1.10, 1.03]})
    text = answers.size_sentence("gloo", 2, h)
    assert text.startswith("gloo, 2 processes: bus bandwidth rises from 0.81 GB/s at 1 MiB")
    assert "peaking at 1.10 GB/s at 10 MiB" in text
    assert "falls at the largest size, 6.4% below 10 MiB's 1.10 GB/s" in text
    falling = h.assign(busbw_gbps=[2.0, 1.5, 1.0])
    text = answers.size_sentence("gloo", 2, falling)
    assert "bandwidth falls from 2.00 GB/s" in text and "fixed cost" not in text
    assert "peaking" not in text


def test_the_size_sentence_says_whether_the_largest_size_levelled_off():
    """The h200-x4 reference's NCCL curve (2 ranks) still rises 22% from 100 MiB to 1 GiB: no
    claim about the links (the CSVs carry no link bandwidth), nor that 1 GiB is short of the
    plateau (its fit puts 1 GiB at 99% of w: 100 MiB is the low point), only the rise."""
    import pandas as pd

    from cs336_systems.stages.allreduce import answers

    sizes = [1.0, 10.0, 100.0, 1024.0]
    rising = pd.DataFrame({"size_mb": sizes, "busbw_gbps": [24.47, 185.8, 267.5, 326.8]})
    text = answers.size_sentence("nccl", 2, rising)
    assert "link" not in text
    assert text.endswith("still rises at the largest size, 22.2% above 100 MiB's 268 GB/s.")
    assert "plateau" not in text
    flat = rising.assign(busbw_gbps=[24.47, 185.8, 320.0, 326.8])
    text = answers.size_sentence("nccl", 2, flat)
    assert "levelled off: 1 GiB is within 2.1% of 100 MiB's 320 GB/s" in text
    assert "plateau" not in text


# ---------------------------- report: a suspect point is kept out of every fit, table and count

H200_CSV = ROOT / "tests" / "fixtures" / "h200-x2"


def _h200_results(tmp_path, clean: bool = False) -> Path:
    """The all-reduce and DDP CSVs of the two-H200 run kept as test data (tests/fixtures), its
    NCCL 1 MiB point (default buffers, 2 ranks) given a time std above its mean, so that the
    generic check flags it (as it flagged the 1 MiB point of another run on the same machine),
    written flagged as the stage's aggregate writes it; `clean`: as run."""
    import pandas as pd
    from fixture_rows import write_results

    from cs336_systems.reporting.sanity import flag

    ar_df = pd.read_csv(H200_CSV / "allreduce.csv")
    one = (ar_df["backend"] == "nccl") & (ar_df["buffers"] == "default") & (ar_df["size_mb"] == 1)
    one &= ar_df["status"] == "ok"
    assert one.sum() == 1
    if not clean:
        ar_df.loc[one, "time_ms_std"] = 1.5 * ar_df.loc[one, "time_ms_mean"]
    ar_df = flag(ar_df, "allreduce")
    ddp = pd.read_csv(H200_CSV / "ddp.csv")
    folder = tmp_path / ("as-run" if clean else "flagged") / "h200-x2"
    return write_results(folder, allreduce=ar_df, ddp=ddp)


def _nccl_fit(results: Path):
    from cs336_systems.reporting.analysis import fit_latency_bandwidth, load

    fit = fit_latency_bandwidth(load(results, "allreduce"))
    return fit.set_index(["backend", "buffers", "world_size"]).loc[("nccl", "default", 2)]


def test_a_suspect_point_stays_out_of_the_latency_fit(tmp_path):
    import pandas as pd

    from cs336_systems.reporting.analysis import fit_latency_bandwidth

    fit = _nccl_fit(_h200_results(tmp_path))
    assert (fit["points"], fit["suspect"]) == (3, 1)
    # the fit of the three other points alone
    df = pd.read_csv(H200_CSV / "allreduce.csv")
    rest = df[(df["backend"] == "nccl") & (df["buffers"] == "default") & (df["size_mb"] > 1)]
    alone = fit_latency_bandwidth(rest[rest["status"] == "ok"]).iloc[0]
    assert fit["latency_us"] == pytest.approx(alone["latency_us"])
    assert fit["bandwidth_gbps"] == pytest.approx(alone["bandwidth_gbps"])
    # unflagged, the 1 MiB point is fitted and moves the latency (the test is not vacuous)
    kept = _nccl_fit(_h200_results(tmp_path, clean=True))
    assert (kept["points"], kept["suspect"]) == (4, 0)
    assert kept["latency_us"] != pytest.approx(fit["latency_us"], rel=0.01)


def test_the_allreduce_section_counts_each_kind_once_and_labels_binary_units(tmp_path):
    import re

    from cs336_systems.reporting import report

    section = report.render(_h200_results(tmp_path), ["allreduce"])
    section = section.split('<a id="allreduce"></a>', 1)[1]
    # 24 points: 8 ran (every one with status ok), 16 skipped; 1 of the 8 is suspect
    assert "8 of 24 points ran (8 ok, 16 skipped); 1 of them failed a sanity check" in section
    # the points that did not run, each reason with how many points it stands for
    assert re.search(r"\| nccl +\| default +\| +4 \| +4 \| skipped: needs 4 GPUs", section)
    # a suspect point is shown marked, and no sentence or fit rests on it
    assert "| 1 MiB     | 0.022 ms (47.86 GB/s) ⚠ suspect |" in section
    assert "nccl, 2 processes: bus bandwidth rises from 197 GB/s at 10 MiB" in section
    assert "(1 suspect point excluded: see Suspect numbers)" in section
    fit_row = [x for x in section.splitlines() if x.startswith("| nccl      | default")][-1]
    assert [c.strip() for c in fit_row.split("|")[-4:-1]] == ["3", "1", "kept"]
    # sizes are MiB and GiB (2**20, 2**30 bytes); rates GB/s (10**9 bytes/s), as labelled
    assert "1 GiB" in section and "MiB = 2^20 bytes" in section and "GB = 10^9 bytes" in section
    assert not re.search(r"\d MB\b|\d GB\b(?!/s)", section)


def test_the_suspect_point_stays_out_of_the_ddp_model_and_the_ring_table(tmp_path):
    """The data-parallel section's bucket-size model and the arithmetic stage's ring-model
    table use the all-reduce points that passed the checks, and say how many they left out."""
    import pandas as pd

    from cs336_systems.reporting.analysis import load
    from cs336_systems.stages.arithmetic.measure import main as arithmetic
    from cs336_systems.stages.ddp import analysis as ddp
    from cs336_systems.stages.ddp.rows import comm_fits

    results = _h200_results(tmp_path)
    fits = comm_fits(load(results, "ddp"), load(results, "allreduce"))
    fit = _nccl_fit(results)
    assert fits["allreduce stage"]["o"] == pytest.approx(fit["latency_us"] * 1e-6)
    assert fits["allreduce stage"]["suspect"] == 1
    clean = comm_fits(load(results, "ddp"), load(_h200_results(tmp_path, True), "allreduce"))
    assert clean["allreduce stage"]["o"] != pytest.approx(fits["allreduce stage"]["o"], rel=0.01)
    ctx = ddp.context(results)
    assert ctx["fits"][0].endswith("GB/s (1 suspect point excluded: see Suspect numbers)")
    # the ring-model rows: every NCCL point that ran but the suspect one
    out = tmp_path / "arithmetic.csv"
    shape = {"name": "s", "tokens": 64, "d_model": 16, "d_ff": 48}
    arithmetic(
        [*block("arithmetic", "gpu", shapes=[shape], splits=[[8, 8]])]
        + ["--allreduce", str(results / "allreduce.csv")]
        + ["--machine", "h200-x2", "--preset", "gpu", "--out", str(out)]
    )
    ring = pd.read_csv(out).query("problem == 'ring_check'")
    assert len(ring) == 7 and len(ring[ring["message_mb"] == 1.0]) == 1  # registered only
    ring_clean = tmp_path / "arithmetic_clean.csv"
    arithmetic(
        [*block("arithmetic", "gpu", shapes=[shape], splits=[[8, 8]])]
        + ["--allreduce", str(_h200_results(tmp_path, True) / "allreduce.csv")]
        + ["--machine", "h200-x2", "--preset", "gpu", "--out", str(ring_clean)]
    )
    assert len(pd.read_csv(ring_clean).query("problem == 'ring_check'")) == 8


def test_the_section_names_only_the_backends_that_ran(tmp_path):
    """An NCCL-only run's section does not describe gloo (the H100 reference once did)."""
    import pandas as pd

    from cs336_systems.reporting import report

    section = report.render(_h200_results(tmp_path), ["allreduce"])
    section = section.split('<a id="allreduce"></a>', 1)[1]
    assert "NCCL with one process per GPU, started by the stage itself on one node" in section
    assert "gloo between CPU processes" not in section
    # ranks over several nodes were started by srun's torchruns
    results = _h200_results(tmp_path)
    df = pd.read_csv(results / "allreduce.csv")
    df.assign(nnodes=2).to_csv(results / "allreduce.csv", index=False)
    section = report.render(results, ["allreduce"])
    assert "started through `srun` and `torchrun` on up to 2 nodes" in section


def test_a_fit_with_unphysical_parameters_is_rejected_with_its_reason():
    from cs336_systems.reporting.analysis import fit_problem

    assert fit_problem(33.0, 300.0, 0.06, 40.0) == ""
    assert "negative" in fit_problem(0.0, 300.0, clipped=True)
    assert "0.070 µs is below 1 µs" in fit_problem(0.07, 300.0)
    assert "50.00 µs is above the fastest measured call (40.00 µs)" in fit_problem(
        50.0, 300.0, 0.1, 40.0
    )
    assert "off by 80%" in fit_problem(33.0, 300.0, 0.8, 40.0)
    assert fit_problem(33.0, -1.0) == "no positive bandwidth"


def test_a_curve_whose_fit_is_negative_is_marked_and_listed_as_rejected(tmp_path):
    """gloo times that grow faster than the size: the least-squares latency is negative,
    clipped to 0; the fit table marks it rejected and the section lists why."""
    import pandas as pd
    from fixture_rows import prov

    from cs336_systems.stages.allreduce import analysis

    rows = [
        {**prov(), "backend": "gloo", "buffers": "default", "world_size": 2, "size_mb": s,
         "bytes": int(s * 2**20), "status": "ok", "time_ms_median": t, "time_ms_mean": t,
         "time_ms_std": 0.01 * t, "busbw_gbps": s * 2**20 / t / 1e6, "max_rel_err": 0.0,
         "warmup": 3, "repeats": 5}
        for s, t in ((1, 0.5), (10, 10.0), (100, 150.0))
    ]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "allreduce.csv", index=False)
    ctx = analysis.context(tmp_path)
    assert ctx["rejected_fits"] == [
        "gloo (default buffers), n = 2: the least-squares per-call cost is negative (clipped to 0)"
    ]
    assert "rejected: the least-squares per-call cost is negative" in ctx["fit_table"]
    assert "⚠" in ctx["fit_table"]


def test_six_gpu_rows_are_skipped_with_the_command_that_runs_them(monkeypatch):
    """NCCL at 6 processes on a 2-GPU host: every point a skipped row carrying the command that
    measures them there (this stage's CLI, the same block at that one world size)."""
    import shlex

    monkeypatch.setattr(launch, "gpu_count", lambda: 2)
    knobs = block("allreduce", "gpu", edition=2025)
    args = ar.parse_args(
        ["--backend", "nccl", "--machine", "m", "--preset", "gpu", "--edition", "2025", *knobs,
         "--out", "results/m/allreduce/nccl.csv"]
    )  # fmt: skip
    rows = ar.run_world_size(args, 6)
    assert {r["status"] for r in rows} == {"skipped: needs 6 GPUs, found 2"}
    command = rows[0]["command"]
    assert all(r["command"] == command for r in rows)
    argv = shlex.split(command)
    assert argv[:3] == ["python3", "-m", "cs336_systems.stages.allreduce"]
    again = ar.parse_args(argv[3:])
    assert again.block.world_sizes == [6] and again.backend == "nccl" and again.edition == 2025
    assert again.block.sizes_mb == args.block.sizes_mb
    assert str(again.out) == "results/m/allreduce/nccl_n6.csv"


def test_the_2025_grid_is_the_handouts_and_the_report_says_what_ran(tmp_path):
    """2025: gloo on CPU processes and NCCL on GPUs, 1 MiB to 1 GiB, 2/4/6 processes, in the gpu
    and full presets (the cpu preset a reduced gloo grid); 2026: NCCL only on a GPU. The
    section counts the asked points this run measured and names the rest with their reason."""
    import pandas as pd

    from cs336_systems import budget
    from cs336_systems.stages.allreduce import analysis

    for preset in ("gpu", "full"):
        g = budget.run_config(edition=2025)["allreduce"][preset]
        assert g["backends"] == ["gloo", "nccl"] and g["world_sizes"] == [2, 4, 6]
        assert g["sizes_mb"] == {"gloo": [1, 10, 100, 1024], "nccl": [1, 10, 100, 1024]}
    assert budget.run_config(edition=2026)["allreduce"]["gpu"]["backends"] == ["nccl"]
    assert budget.run_config(edition=2025)["allreduce"]["cpu"]["world_sizes"] == [2, 4, 6]
    df = pd.read_csv(H200_CSV / "allreduce.csv").assign(edition=2025)
    df.to_csv(tmp_path / "allreduce.csv", index=False)
    grid = analysis.context(tmp_path)["grid"]
    ran = ((df["status"] == "ok") & (df["buffers"] == "default")).sum()
    assert grid[0] == (
        "The 2025 handout asks for gloo on CPU processes and nccl on GPUs, 1 MiB–1 GiB at 2, 4, 6 "
        f"processes: 24 points; this run measured {ran} of them:"
    )
    assert "gloo on CPU processes, 2 processes: not in this preset's grid (1 MiB–1 GiB)" in grid
    assert "nccl on GPUs, 6 processes: skipped: needs 6 GPUs, found 2 (1 MiB–1 GiB)" in grid


def test_the_allreduce_figures_labels_do_not_collide(tmp_path, monkeypatch):
    from figure_checks import drawn_figures

    from cs336_systems.stages.allreduce import figures

    results = _h200_results(tmp_path)
    with drawn_figures(monkeypatch, figures) as caught:
        figures.draw(results, tmp_path / "figures")
    assert len(caught) == 2
    assert all(hits == [] for _, hits in caught), caught
