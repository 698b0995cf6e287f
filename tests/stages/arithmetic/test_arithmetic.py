"""The arithmetic stage on fixture CSVs: its rows against core/costs.py and hand-computed inputs,
a missing input as `skipped` rows (the run goes on), the report section, the plan checks and
the workflow's dry run."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from pipeline_utils import block, copy_workflow, planned_jobs, snakemake

from cs336_systems.core import costs
from cs336_systems.planning.config import Checker, Facts
from cs336_systems.stages.arithmetic import analysis, plan
from cs336_systems.stages.arithmetic.measure import main

SHAPE = {"name": "s", "tokens": 64, "d_model": 16, "d_ff": 48}  # B=64, D=16, D_FF=48
# the cpu preset's B200, XXL model and TPU with a small shape and grid
KNOBS = {"shapes": [SHAPE], "devices": [2, 4], "splits": [[2, 2]], "message_mb": 2}


def ceilings_csv(path, dtypes=("fp32", "bf16"), fp32=1.5) -> str:
    rows = [
        {"kind": "matmul", "dtype": d, "path": "matmul", "status": "ok", "tflops": t}
        for d, t in (("fp32", fp32), ("bf16", 4.0), ("fp16", 5.0))
        if d in dtypes
    ]
    if "bf16" in dtypes:
        rows.append(
            {
                "kind": "matmul",
                "dtype": "bf16",
                "path": "autocast_linear",
                "status": "ok",
                "tflops": 3.0,
            }
        )
    rows.append({"kind": "copy", "dtype": "fp32", "path": "copy_", "status": "ok", "gbps": 20.0})
    pd.DataFrame(rows).to_csv(path, index=False)
    return str(path)


def allreduce_csv(path, backend="gloo") -> str:
    """Two world sizes; the best busbw is 3.0 GB/s (2 ranks, 8 MB); one failed point."""
    rows = []
    for n, mb, busbw in ((2, 1, 1.0), (2, 8, 3.0), (4, 8, 2.5), (4, 64, 0.0)):
        nbytes = mb * 2**20
        algbw = busbw / (2 * (n - 1) / n)
        rows.append(
            {
                "backend": backend,
                "buffers": "default",
                "world_size": n,
                "size_mb": float(mb),
                "bytes": nbytes,
                "status": "ok" if busbw else "oom",
                "time_ms_median": nbytes / (algbw * 1e9) * 1e3 if busbw else math.nan,
                "busbw_gbps": busbw if busbw else math.nan,
            }
        )
    pd.DataFrame(rows).to_csv(path, index=False)
    return str(path)


def run(tmp_path, *extra, backends=("gloo",)) -> pd.DataFrame:
    out = tmp_path / "arithmetic.csv"
    measured = {"dtypes": ["fp16", "bf16"], "backends": list(backends)}
    knobs = block("arithmetic", **KNOBS, measured=measured)
    main(["--machine", "t", "--preset", "cpu", *knobs, "--out", str(out), *extra])
    return pd.read_csv(out)


def pick(df, case, problem, quantity, devices=None):
    r = df[(df["case"] == case) & (df["problem"] == problem) & (df["quantity"] == quantity)]
    if devices is not None:
        r = r[r["devices"] == devices]
    assert len(r) == 1, (case, problem, quantity, len(r))
    return float(r["value"].iloc[0])


def test_rows_are_the_cost_functions_at_the_inputs_numbers(tmp_path):
    df = run(
        tmp_path,
        "--ceilings",
        ceilings_csv(tmp_path / "c.csv"),
        "--allreduce",
        allreduce_csv(tmp_path / "a.csv"),
    )
    assert (df["status"] == "ok").all()
    # measured: C = the fastest bf16 path (no fp16 row; plain 4.0 over autocast 3.0), W = best
    # busbw
    c, w = 4.0e12, 3.0e9
    assert pick(df, "measured-gloo", "data_parallel_calcs", "max_devices", 2) == pytest.approx(
        1 + 64 * w / c
    )
    assert pick(df, "measured-gloo", "tp_calcs", "forward_comm_time", 4) == pytest.approx(
        costs.tensor_parallel(64, 16, 48, 4, c, w)["forward_comm_time"].value
    )
    b200 = costs.fsdp_tp(64, 16, 48, 2, 2, 2.5e15, 9e11)
    assert pick(df, "b200", "fsdp_tp_calcs", "serial_max_devices") == pytest.approx(
        b200["serial_max_devices"].value
    )
    assert pick(df, "b200", "alternate_ring_all_reduce", "time", 4) == pytest.approx(
        3 * 2 * 2**20 / 9e11
    )
    formulas = df[df["quantity"] == "backward_comm_time"]["formula"].drop_duplicates()
    assert "12 (N_DP-1) D D_FF / (N_DP W)" in set(formulas)
    # the ring check: one row per ok all-reduce point; 2 ranks at 8 MB ran at the best busbw
    ring = df[df["problem"] == "ring_check"]
    assert len(ring) == 3
    best = ring[(ring["devices"] == 2) & (ring["message_mb"] == 8)]
    assert float(best["value"].iloc[0]) == pytest.approx(1.0)
    slow = ring[(ring["devices"] == 2) & (ring["message_mb"] == 1)]
    assert float(slow["value"].iloc[0]) == pytest.approx(3.0)


def test_c_is_the_fastest_path_and_a_faster_fp32_is_taken_and_named(tmp_path):
    """A CPU without 16-bit units: fp32 (6.0) beats both bf16 paths (4.0 plain, 3.0 autocast),
    so C is the fp32 peak and the source says why; where a 16-bit path is fastest it is named
    with its path."""
    a = allreduce_csv(tmp_path / "a.csv")
    df = run(tmp_path, "--ceilings", ceilings_csv(tmp_path / "c.csv", fp32=6.0), "--allreduce", a)
    assert pick(df, "measured-gloo", "data_parallel_calcs", "max_devices", 2) == pytest.approx(
        1 + 64 * 3.0e9 / 6.0e12
    )
    source = df[df["case"] == "measured-gloo"]["source"].iloc[0]
    assert source.startswith(
        "ceilings: fp32 matmul 6 TFLOP/s, faster than its fastest 16-bit path (bf16 matmul 4 "
    )
    rows = pd.read_csv(ceilings_csv(tmp_path / "c2.csv"))
    rows.loc[rows["path"] == "autocast_linear", "tflops"] = 8.0
    rows.to_csv(tmp_path / "c2.csv", index=False)
    df = run(tmp_path, "--ceilings", str(tmp_path / "c2.csv"), "--allreduce", a)
    assert pick(df, "measured-gloo", "data_parallel_calcs", "max_devices", 2) == pytest.approx(
        1 + 64 * 3.0e9 / 8.0e12
    )
    source = df[df["case"] == "measured-gloo"]["source"].iloc[0]
    assert source.startswith("ceilings: bf16 matmul (autocast F.linear) 8 TFLOP/s;")


def test_a_missing_input_is_a_skipped_row_and_the_run_goes_on(tmp_path):
    df = run(tmp_path, "--ceilings", ceilings_csv(tmp_path / "c.csv"))
    b200 = df[df["case"] == "b200"]
    assert len(b200) and (b200["status"] == "ok").all()
    measured = df[df["case"] == "measured-gloo"]
    assert (
        measured["status"] == "skipped: no bus bandwidth: stage allreduce is not in this run"
    ).all()
    assert set(measured["problem"]) == {
        "alternate_ring_all_reduce",
        "data_parallel_calcs",
        "fsdp_calcs",
        "tp_calcs",
        "fsdp_tp_calcs",
        "ring_check",
    }
    # no NCCL row on a CPU machine
    df = run(
        tmp_path,
        "--ceilings",
        ceilings_csv(tmp_path / "c.csv"),
        "--allreduce",
        allreduce_csv(tmp_path / "a.csv"),
        backends=["nccl"],
    )
    nccl = df[df["case"] == "measured-nccl"]
    assert set(nccl["status"]) == {"skipped: no ok nccl row in allreduce.csv"}
    # no 16-bit matmul: only what needs W alone runs (the alternate ring, the ring check)
    df = run(
        tmp_path,
        "--ceilings",
        ceilings_csv(tmp_path / "c32.csv", dtypes=("fp32",)),
        "--allreduce",
        allreduce_csv(tmp_path / "a.csv"),
    )
    m = df[df["case"] == "measured-gloo"]
    ran = m[m["status"] == "ok"]
    assert set(ran["problem"]) == {"alternate_ring_all_reduce", "ring_check"}
    assert set(m[m["status"] != "ok"]["status"]) == {
        "skipped: no ok fp16/bf16 matmul row in ceilings.csv"
    }


def test_report_section_from_the_rows(tmp_path):
    run(
        tmp_path,
        "--ceilings",
        ceilings_csv(tmp_path / "c.csv"),
        "--allreduce",
        allreduce_csv(tmp_path / "a.csv"),
    )
    ctx = analysis.context(tmp_path)
    assert ctx["available"] and ctx["q34"] and ctx["q35"] and ctx["q36"] and ctx["ring"]
    assert "coverage" not in ctx
    assert ctx["q34"]["formula"] == "(N-1) S / W"
    # B200: B W / C = 64 * 9e11 / 2.5e15 ~ 0.023: communication-bound on two devices, said so
    b200 = [s for s in ctx["q35"]["sentences"] if s.startswith("B200")]
    assert "communication-bound already on two devices" in b200[0]
    assert "1.02 devices" in b200[0]
    # W is the bus bandwidth of one measured row: that row matches by construction, is marked
    # so, and no sentence quotes it as agreement
    assert ctx["ring"]["sentences"][0].startswith("gloo: W = ")
    assert "equals the measurement there by construction" in ctx["ring"]["sentences"][0]
    assert ctx["ring"]["table"].count("1× (W measured here)") == 1
    assert not any("1.00× the model's" in s for s in ctx["ring"]["sentences"])
    # without the allreduce CSV the measured case is skipped and the coverage says partly
    (tmp_path / "arithmetic.csv").unlink()
    run(tmp_path, "--ceilings", ceilings_csv(tmp_path / "c.csv"))
    ctx = analysis.context(tmp_path)
    assert ctx["measured_missing"] == ["measured-gloo"]
    assert ctx["coverage"]["tp_calcs.c"]["status"] == "partly"
    assert "communication_accounting.a" not in ctx["coverage"]
    assert "stage allreduce is not in this run" in ctx["skipped"]
    assert not ctx["ring"]


def test_plan_inputs_options_and_checks():
    assert plan.inputs(["arithmetic", "ceilings"], "results/m") == {
        "ceilings": "results/m/ceilings.csv"
    }
    assert plan.input_args({"allreduce": "r/a.csv", "ceilings": "r/c.csv"}) == (
        "--allreduce r/a.csv --ceilings r/c.csv"
    )
    cfg = {
        "shapes": [
            {"name": "a", "tokens": 8, "d_model": 4, "d_ff": 16},
            {"name": "a", "tokens": 8, "d_model": 4, "d_ff": 16},
        ],
        "devices": [2],
        "splits": [[1, 1], [2, 2]],
        "message_mb": 1,
        "b200": {"tflops": 2500, "egress_gbps": 900},
        "xxl": {"d_model": 16384, "d_ff": 53248, "blocks": 126},
        "tpu": {"tflops": 460, "ici_gbps": 180, "hbm_gb": 95, "mesh": [16, 4], "axes": [2, 1]},
        "h100_gb": 80,
        "measured": {"dtypes": ["bf16"], "backends": ["gloo"]},
        "activation": {"size": "huge", "batch_size": 4, "context_lengths": [512]},
    }
    knobs = plan.ArithmeticKnobs.from_block(cfg)  # typed: nested blocks and a list of shapes
    assert knobs.shapes[1] == plan.Shape("a", 8, 4, 16) and knobs.tpu.mesh == [16, 4]
    at = Checker(("arithmetic", "cpu"))
    plan.check(cfg, at, Facts("cpu", True, "m", ("arithmetic",)))
    where = [p.path for p in at.problems]
    assert where == [
        ("arithmetic", "cpu", "shapes", 1, "name"),
        ("arithmetic", "cpu", "activation", "size"),  # not a model size of the edition
        ("arithmetic", "cpu", "splits", 0),
    ]


def test_dry_run_plans_the_stage_with_its_inputs(tmp_path):
    work = copy_workflow(tmp_path / "wf")
    cfg = ["--configfile", "tests/data/tiny_config.yaml"]
    jobs = planned_jobs(work, *cfg, "--config", "stages=[arithmetic]")
    assert jobs == {"arithmetic": 1, "report": 1}
    jobs = planned_jobs(work, *cfg, "--config", "stages=[ceilings,arithmetic]")
    assert jobs == {"ceilings": 1, "arithmetic": 1, "report": 1}
    proc = snakemake(work, "--dry-run", "-p", *cfg, "--config", "stages=[ceilings,arithmetic]")
    out = proc.stdout + proc.stderr
    assert "--ceilings results/tiny-test/ceilings.csv" in out and "--allreduce" not in out


def test_communication_accounting_answers_every_part(tmp_path):
    """The 2025 handout's XXL model on TPU v5p: each part's numbers from core/costs.py's
    formulas, each sentence from the rows, and the 2025 coverage rows answered."""
    from cs336_systems.reporting import coverage, report

    run(tmp_path)
    df = pd.read_csv(tmp_path / "arithmetic.csv")
    acc = df[df["problem"] == "communication_accounting"]
    handout = acc[acc["variant"] == "handout"].set_index("quantity")["value"]
    # P = 2 D D_FF L; 16 bytes a parameter; GB = 1e9 as the handout's
    assert handout["params"] == 2 * 16384 * 53248 * 126
    assert handout["state_bytes"] == pytest.approx(3.5176e12, rel=1e-4)
    assert handout["state_h100s"] == pytest.approx(43.97, abs=0.01)
    assert handout["activation_bytes_per_token"] == 2 * 126 * (16384 + 53248)
    # b >= C / (W_ici M_X Y) = 4.6e14 / (1.8e11 * 2 * 4); B = 64 b
    assert handout["batch_per_device"] == pytest.approx(4.6e14 / (1.8e11 * 8))
    assert handout["batch"] == pytest.approx(64 * handout["batch_per_device"])
    assert handout["min_devices_state"] == pytest.approx(3.5176e12 / 95e9, rel=1e-4)
    assert handout["min_devices_state"] < handout["min_devices"] < 39
    # at the rounded-up N the per-device memory fits the 95 GB, one device fewer it does not
    assert handout["per_device_bytes"] <= 95e9
    # part (d): every variant lowers the per-device batch; more TP stays within its bound
    per_variant = acc[acc["quantity"] == "batch_per_device"].set_index("variant")["value"]
    assert set(per_variant.index) == {
        "handout", "more TP", "8-bit all-gathers", "more TP and 8-bit all-gathers"
    }  # fmt: skip
    assert (per_variant.drop("handout") < per_variant["handout"]).all()
    more_tp = acc[(acc["variant"] == "more TP")]
    assert int(more_tp["n_tp"].iloc[0]) <= handout["max_tp"]
    assert int(more_tp["devices"].iloc[0]) == 64
    ctx = analysis.context(tmp_path)
    q = ctx["q38"]
    assert "3,518 GB" in q["a"] and "44.0 H100 80GB" in q["a"]
    assert "N_FSDP = 39" in q["b"] and "so 38 devices" in q["b"]
    assert "20,444 tokens" in q["c"] and "319 tokens per device" in q["c"]
    assert "79.9 tokens a device" in q["d"] and "pipeline parallelism" in q["d"]
    table = coverage.coverage_table(
        "2025", report.declared_questions(), {"arithmetic": ctx}, coverage.Machine(0, "cpu")
    )
    table.index = coverage.edition_questions("2025")
    for part in "abcd":
        assert table.loc[f"communication_accounting.{part}", "status"] == "answered"


def test_a_2025_run_answers_its_own_problem_only(tmp_path):
    """Rows of the 2025 edition: the section shows its communication accounting, not the 2026
    handout's section 8 nor that section's skipped rows; the TPU is labelled the handout's."""
    run(tmp_path)
    df = pd.read_csv(tmp_path / "arithmetic.csv")
    assert {"tp_calcs", "communication_accounting"} <= set(df["problem"])
    df["edition"] = 2025
    df.to_csv(tmp_path / "arithmetic.csv", index=False)
    ctx = analysis.context(tmp_path)
    assert ctx["q38"] and not ctx["q34"] and not ctx["q35"] and not ctx["q36"]
    assert not ctx["skipped"] and not ctx["measured_missing"]
    assert "TPU v5p (handout)" in ctx["sources"]
    assert not any(label.startswith("this machine") for label in ctx["sources"])


def test_each_calc_has_its_one_sentence_justification(tmp_path):
    """Every part of section 8 the rows answer gets its answer (the rows' formula) and one
    sentence of justification, in the handout's order."""
    from cs336_systems.stages.arithmetic import answers

    run(tmp_path)
    good = pd.read_csv(tmp_path / "arithmetic.csv")
    justified = answers.justified(good[good["status"] == "ok"])
    parts = [j["part"] for j in justified]
    assert parts[0] == "alternate_ring_all_reduce" and parts[-1] == "fsdp_tp_calcs (d)"
    for p in ("data_parallel_calcs (a)", "fsdp_calcs (c)", "tp_calcs (d)", "fsdp_tp_calcs (b)"):
        assert p in parts
    dp = {j["part"]: j for j in justified}["data_parallel_calcs (a)"]
    assert dp["answer"] == "12 B D D_FF / N_DP" and dp["why"].endswith(".")
    assert all(j["why"] and j["answer"] != "–" for j in justified)
    table = analysis.context(tmp_path)["justified"]
    assert "| data_parallel_calcs (a) " in table and "N_DP - 1 <= B W / C" in table


@pytest.mark.parametrize(("edition", "size", "mib"), [(2026, "xl", 20.0), (2025, "2.7B", 20.0)])
def test_memory_d_is_derived_for_the_editions_model(tmp_path, edition, size, mib):
    """memory_profiling (d) for the model the edition's handout names (2026: xl; 2025: 2.7B, both
    d_model 2560) at batch 4: 4 x 512 x 2560 x 4 bytes = 20 MiB, on any machine."""
    out = tmp_path / "arithmetic.csv"
    main(["--machine", "t", "--preset", "cpu", "--edition", str(edition),
          *block("arithmetic", edition=edition), "--out", str(out)])  # fmt: skip
    df = pd.read_csv(out)
    act = df[df["problem"] == "residual_activation"]
    assert set(act["size"]) == {size}
    assert act.set_index("context_length").loc[512, "value"] == pytest.approx(mib)
    q16 = analysis.context(tmp_path)["q16"]
    assert (
        q16["model"] == size and "4 x 512 x 2,560 x 4 = 20,971,520 bytes = 20.0 MiB" in q16["text"]
    )


def test_the_2025_cpu_run_plans_and_counts_the_2025_parts(tmp_path):
    """`snakemake report --config edition=2025` on the cpu preset plans every stage's jobs, and
    its report's coverage counts the 2025 handout's 43 parts, memory (d) answered by the
    arithmetic for the 2.7B (one stage run here: the arithmetic)."""
    from cs336_systems.reporting import report

    work = copy_workflow(tmp_path / "wf")
    jobs = planned_jobs(work, "--config", "preset=cpu", "edition=2025", "machine=cpu-2025")
    assert jobs["report"] == 1 and jobs["arithmetic"] == 1 and jobs["kernel_tests"] == 1
    results = tmp_path / "results" / "cpu-2025"
    results.mkdir(parents=True)
    main(["--machine", "cpu-2025", "--preset", "cpu", "--edition", "2025",
          *block("arithmetic", edition=2025), "--out", str(results / "arithmetic.csv")])  # fmt: skip
    text = report.render(results, ["arithmetic"], edition="2025")
    assert "Of the 43 parts of the 2025 handout's problems" in text
    row = next(line for line in text.splitlines() if line.startswith("| [memory_profiling (d)]"))
    assert "| answered " in row and "[arithmetic](#arithmetic)" in row
    assert (
        "communication_accounting (d)" in text
        and "fsdp_tp_calcs" not in text.split("## Provenance")[0]
    )
