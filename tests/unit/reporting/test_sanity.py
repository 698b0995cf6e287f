"""Sanity flags (reporting/sanity.py) on fixture rows, and what the report does with a suspect point:
shows it with its reason, and rests no sentence on it."""

from __future__ import annotations

import pandas as pd
import pytest
from fixture_rows import benchmark_rows, ceilings_rows, write_results

from cs336_systems.planning import neighbours
from cs336_systems.profiling.kernel_classes import gemm_unit, kernel_label, unique_labels
from cs336_systems.reporting import report, sanity
from cs336_systems.reporting.analysis import fmt, load, ok, ran, sig
from cs336_systems.stages.benchmark import analysis as benchmark_analysis
from cs336_systems.stages.benchmark.mfu import add_mfu
from cs336_systems.stages.profile import answers as profile_answers
from cs336_systems.stages.profile import rows as profile_rows


def reasons(df: pd.DataFrame) -> list[str]:
    return df[sanity.COLUMN].fillna("").tolist()


def test_std_above_mean_and_negative_values_are_suspect():
    df = pd.DataFrame(
        {
            "status": ["ok", "ok", "ok", "error: x"],
            "step_ms_mean": [10.0, 10.0, -1.0, float("nan")],
            "step_ms_std": [1.0, 12.0, 0.1, 50.0],
        }
    )
    out = sanity.flag(df, checks=sanity.checks_for("nothing-declared"))
    r = reasons(out)
    assert r[0] == ""
    assert r[1].startswith("suspect: ") and "step_ms_std 12.0 above step_ms_mean 10.0" in r[1]
    assert "step_ms_mean is -1.00" in r[2]
    assert r[3] == ""  # a failed row has no numbers to doubt
    assert len(ok(out)) == 1 and len(ran(out)) == 3


def test_a_change_may_be_negative_a_size_may_not():
    """A block's backward frees what its forward saved: allocated memory falls (the H100
    reference's block at context 2048: -3,745,558,528 bytes), no fault of the measurement."""
    df = pd.DataFrame(
        {
            "status": ["ok", "ok", "ok"],
            "backward_alloc_change_bytes": [-3_745_558_528, float("inf"), 1.0],
            "output_bytes": [1.0, 1.0, -1.0],
        }
    )
    r = reasons(sanity.flag(df, checks=sanity.checks_for("nothing-declared")))
    assert r[0] == ""
    assert "backward_alloc_change_bytes is inf" in r[1]
    assert "output_bytes is -1.00" in r[2] and "change" not in r[2]


def test_mfu_above_100_percent_is_suspect():
    df = pd.DataFrame(
        {"status": ["ok", "ok"], "mfu": [0.5, 10.505], "tflops": [1, 2.1], "peak_tflops": [2, 0.2]}
    )
    r = reasons(sanity.flag(df, checks=sanity.checks_for("x")))
    assert r[0] == "" and "MFU 1050% is above 100%" in r[1]
    # just above: the digits that show it (the CPU reference once read "MFU 100% is above 100%")
    df["mfu"] = [1.0015, 1.00004]
    r = reasons(sanity.flag(df, checks=sanity.checks_for("x")))
    assert "MFU 100.2% is above" in r[0] and "MFU 100.004% is above" in r[1]


def test_forward_backward_slower_than_the_step_flags_both_rows():
    df = benchmark_rows(ms={("tiny", "forward_backward", "fp32"): 50.0})
    out = sanity.flag(df, "benchmark")  # the benchmark stage declares the check
    flagged = out[sanity.is_suspect(out)]
    assert set(flagged["mode"]) == {"forward_backward", "train_step"}
    assert set(flagged["precision"]) == {"fp32"}
    assert (
        "forward+backward slower than the full training step: 50.0 > 35.0"
        in (flagged[sanity.COLUMN].iloc[0])
    )
    # the time check doubts times: a memory sentence may still use the rows
    assert sanity.is_suspect(out, "time").sum() == 2
    assert sanity.is_suspect(out, "memory").sum() == 0


def test_a_model_slower_than_a_larger_one_at_the_same_point_is_suspect():
    """tiny's fp32 forward at 40 ms where small's, ten times the work, takes 10: tiny's time is
    not its own work's. Only tiny's row is flagged, naming small; 5% is let pass."""
    df = benchmark_rows(sizes=("tiny", "small"), ms={("tiny", "forward", "fp32"): 40.0})
    df.loc[df["size"] == "small", "flops_per_step"] *= 10
    out = sanity.flag(df, "benchmark")
    flagged = out[out[sanity.COLUMN].fillna("").str.contains("larger model")]
    assert flagged[["size", "mode", "precision"]].values.tolist() == [["tiny", "forward", "fp32"]]
    assert "(`small`): 40.0 > 10.0 ms (step_ms_mean)" in flagged[sanity.COLUMN].iloc[0]
    df.loc[(df["size"] == "tiny") & (df["mode"] == "forward"), "step_ms_mean"] = 10.4
    assert not sanity.flag(df, "benchmark")[sanity.COLUMN].fillna("").str.contains("larger").any()


def test_the_four_h200_runs_large_bf16_forward_is_suspect_beside_xl():
    """The four-H200 run of 5f1ec1e: large's bf16 forward 72.8 ms and forward+backward 172,
    xl's 62.0 and 160 for 3.5x the work; their training steps in order (174 and 192)."""
    ms = {("large", "forward", "bf16"): 72.8, ("large", "forward_backward", "bf16"): 172.0,
          ("large", "train_step", "bf16"): 174.0, ("xl", "forward", "bf16"): 62.0,
          ("xl", "forward_backward", "bf16"): 160.0, ("xl", "train_step", "bf16"): 192.0}  # fmt: skip
    df = benchmark_rows(sizes=("large", "xl"), ms=ms)
    df.loc[df["size"] == "xl", "flops_per_step"] *= 3.5
    out = sanity.flag(df, "benchmark")
    hit = out[out[sanity.COLUMN].fillna("").str.contains("larger model")]
    assert sorted(hit["mode"]) == ["forward", "forward_backward"]
    assert set(hit["size"]) == {"large"} and set(hit["precision"]) == {"bf16"}


def test_a_part_slower_than_its_whole_is_set_against_the_rows_spread():
    """The reason says whether the gap is within the step-to-step std of the two rows (noise
    a reader can weigh) or larger than it."""
    key = ("tiny", "forward_backward", "fp32")
    for std, side in ((20.0, "within"), (1.0, "larger than")):
        df = benchmark_rows(ms={key: 50.0})
        pair = (df["size"] == "tiny") & (df["precision"] == "fp32") & (df["mode"] != "forward")
        df.loc[pair, "step_ms_std"] = std
        out = sanity.flag(df, "benchmark")
        why = out[sanity.is_suspect(out)][sanity.COLUMN].iloc[0]
        assert f"the gap, 15.0 ms, is {side} the step-to-step std of the two" in why, why
    df = benchmark_rows(ms={key: 50.0}).drop(columns="step_ms_std", errors="ignore")
    why = sanity.flag(df, "benchmark")[sanity.COLUMN].dropna()
    assert not why.str.contains("gap").any()


def test_warmup_sweep_without_warmup_may_have_a_std_above_its_mean():
    w = pd.DataFrame(
        {
            "status": ["ok", "ok"],
            "warmup_steps": [0, 1],
            "step_ms_mean": [100.0, 50.0],
            "step_ms_std": [150.0, 60.0],
        }
    )
    r = reasons(sanity.flag(w, "benchmark_warmup"))
    assert r[0] == "" and r[1].startswith("suspect: ")


def test_mfu_uses_the_model_path_ceiling():
    df = benchmark_rows()
    with_path = add_mfu(df, ceilings_rows(bf16=0.1, autocast=1.0))
    bf16 = with_path[with_path["precision"] == "bf16"]
    assert set(bf16["peak_path"]) == {"autocast_linear"} and (bf16["peak_tflops"] == 1.0).all()
    fp32 = with_path[with_path["precision"] == "fp32"]
    assert set(fp32["peak_path"]) == {"matmul"} and (fp32["peak_tflops"] == 0.5).all()
    # without the model-path ceiling there is no bf16 MFU, rather than one against the wrong path
    without = add_mfu(df, ceilings_rows(autocast=None))
    bf16 = without[without["precision"] == "bf16"]
    assert bf16["mfu"].isna().all() and bf16["peak_path"].str.startswith("missing").all()


def test_an_mfu_taken_against_another_path_is_suspect():
    df = add_mfu(benchmark_rows(), ceilings_rows()).assign(peak_path="matmul")
    out = sanity.flag(df, "benchmark")
    bf16 = out[out["precision"] == "bf16"]
    assert sanity.is_suspect(bf16).all()
    assert "measured through a plain matmul" in bf16[sanity.COLUMN].iloc[0]
    assert not sanity.is_suspect(out[out["precision"] == "fp32"]).any()


def test_rate_above_the_ceiling_and_greater_than():
    flash = pd.DataFrame(
        {"status": ["ok", "ok"], "dtype": ["bf16", "bf16"], "fwd_bwd_tflops": [0.05, 0.2]}
    )
    r = reasons(sanity.flag(flash, "flash", ceilings=ceilings_rows(bf16=0.1)))
    assert r[0] == "" and "fwd_bwd_tflops 0.200 above the measured bf16 matmul peak" in r[1]
    mem = pd.DataFrame({"status": ["ok"], "params_mb": [100.0], "peak_allocated_mb": [50.0]})
    assert "below the parameters" in reasons(sanity.flag(mem, "memory"))[0]


def test_recorded_reasons_are_kept_and_not_repeated():
    df = pd.DataFrame({"status": ["ok"], "mfu": [2.0], "tflops": [2.0], "peak_tflops": [1.0]})
    once = sanity.flag(df, "x")
    twice = sanity.flag(once, "x")
    assert reasons(once) == reasons(twice)
    # a reason written by an older aggregate, without its scope, doubts every number
    old = pd.DataFrame({"status": ["ok"], sanity.COLUMN: ["suspect: from the aggregate"]})
    assert sanity.is_suspect(sanity.flag(old, "x"), "memory").all()


def test_stages_declare_their_checks_as_data():
    declared = sanity.declared()
    assert {c["kind"] for c in declared["benchmark"]} >= {"part_slower_than_whole", "ceiling_path"}
    assert declared["flash"][0]["kind"] == "rate_above_ceiling"
    kinds = [c["kind"] for c in sanity.checks_for("benchmark_warmup")]
    assert kinds.count("std_above_mean") == 1  # the declaration replaced the generic check


def test_declarations_name_the_csvs_they_check():
    """A declaration is keyed by the CSV's name as the aggregate and `load` look it up (its stem,
    e.g. `fsdp`): a key they never ask for leaves the generic checks in force, silently."""
    stems = {p.parent.name for p in sanity.STAGES_DIR.glob("*/__init__.py")}
    for key in sanity.declared():
        # a stage's CSV is named after it (`fsdp`) or starts with its name (`benchmark_warmup`)
        assert not key.endswith(".csv"), key
        assert any(key == s or key.startswith(f"{s}_") for s in stems), key
    df = pd.DataFrame(
        {"variant": ["ddp_bf16"], "step_ms_mean": [222.0], "step_ms_std": [15.2],
         "comm_ms_mean": [0.71], "comm_ms_std": [0.95]}
    )  # fmt: skip
    # the sync after backward is a skewed wait: its std above its mean is no fault of the step
    assert not sanity.is_suspect(sanity.flag(df, "fsdp")).any()


def test_numbers_keep_significant_digits():
    assert fmt(0.00087) == "0.00087" and fmt(0.1, 1) == "0.10" and fmt(722.9) == "723"
    assert sig(0.00087) == "0.000870" and sig(52.0) == "52.0" and sig(3002.4) == "3,002"
    assert sig(float("nan")) == "–"


@pytest.fixture
def suspect_run(tmp_path):
    """A CPU run whose fp32 forward+backward is slower than its step and whose bf16 MFU would
    be 1050% against a plain bf16 matmul."""
    bench = benchmark_rows(ms={("tiny", "forward_backward", "fp32"): 50.0})
    return write_results(
        tmp_path / "results" / "fixture-cpu",
        benchmark=bench,
        ceilings=ceilings_rows(fp32=0.5, bf16=0.0001, autocast=0.5),
    )


def test_benchmark_sentences_leave_suspect_points_out(suspect_run):
    s = benchmark_analysis.context(suspect_run)
    assert s["n_suspect"] == 2
    # Q1: the fp32 ratio rests on no point, and says so; bf16 keeps its point
    assert "fp32" not in s["bwd"]
    assert "1 suspect point excluded" not in s["bwd"]["bf16"]
    assert "⚠ suspect" in s["latency_fp32"] and "⚠" not in s["latency_bf16"]
    # Q4: MFU against the model path (no 1050%), suspect rows excluded and counted
    assert "%" in s["mfu_best"] and "1050" not in s["mfu_best"]
    assert "suspect points excluded" in s["mfu_best"]
    assert "autocast F.linear" in " ".join(s["mfu_paths"])


def test_report_lists_suspect_numbers_with_their_reason(suspect_run):
    text = report.render(suspect_run, ["ceilings", "benchmark"])
    section = text.split('<a id="benchmark"></a>')[1]
    assert "**Suspect numbers.** 2 measured rows" in section and "They are shown" in section
    assert "forward+backward slower than the full training step: 50.0 > 35.0" in section
    # the ceilings print by magnitude, not as 0.0
    assert "0.000100 TFLOP/s" in text and "0.0 TFLOP/s" not in text


def test_a_run_whose_every_training_step_is_suspect_still_renders(tmp_path):
    """Every train_step row above the measured peak (MFU > 100%): the MFU table says there is
    nothing to show, the report renders (it once failed on the missing table, under SLURM)."""
    fast = {("tiny", "train_step", p): 0.001 for p in ("fp32", "bf16")}
    run = write_results(
        tmp_path / "results" / "fixture-cpu",
        benchmark=benchmark_rows(ms=fast),
        ceilings=ceilings_rows(fp32=0.5, bf16=0.5, autocast=0.5),
    )
    s = benchmark_analysis.context(run)
    assert s["mfu_table"].startswith("_No training step has an MFU to show (")
    assert "No training step has an MFU to show" in report.render(run, ["ceilings", "benchmark"])


def test_load_collects_the_suspect_rows_a_section_read(suspect_run):
    with sanity.collecting() as found:
        load(suspect_run, "benchmark")
    assert len(sanity.owned(found, "benchmark")) == 2
    assert sanity.owned(found, "ceilings").empty


# ------------------------------------------------------------------------ profile (Q7, Q9)


def _kernels() -> pd.DataFrame:
    """Forward kernels of two points: two different elementwise kernels whose short names
    coincide, the QK^T range holding the matmul and the 1/sqrt(d) scaling."""
    ew = "void at::native::vectorized_elementwise_kernel<(int)4, at::native::{}, std::array<char *, (unsigned long)2>>(int, T2, T3)"
    add, mul = (
        ew.format("CUDAFunctor_add<float>"),
        ew.format(
            "AUnaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float>>"
        ),
    )
    gemm = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas"
    rows = []
    for ctx in (128, 256):
        for phase, kernel, cls, ms in (
            ("forward", gemm, "gemm", 8.0),
            ("forward", add, "elementwise", 1.0),
            ("forward", mul, "elementwise", 1.0),
            ("attention.qk_matmul", gemm, "gemm", 2.0),
            ("attention.qk_matmul", mul, "elementwise", 1.0),
            ("attention.softmax", "void softmax_warp_forward<float>()", "reduction", 1.0),
            ("attention.pv_matmul", gemm, "gemm", 2.0),
        ):
            rows.append(
                {
                    "size": "small",
                    "context_length": ctx,
                    "mode": "forward",
                    "phase": phase,
                    "kernel": kernel,
                    "kernel_class": cls,
                    "calls_per_step": 12,
                    "ms_per_step": ms,
                    "share": ms / 10.0,
                }
            )
    df = pd.DataFrame(rows)
    return df.assign(kernel_short=df["kernel"].map(unique_labels(df["kernel"])))


def test_kernel_labels_keep_different_kernels_apart():
    k = _kernels()
    labels = set(k["kernel_short"])
    assert "vectorized_elementwise_kernel[CUDAFunctor_add]" in labels
    assert "vectorized_elementwise_kernel[AUnaryFunctor/MulFunctor]" in labels
    assert kernel_label("aten::mm") == "aten::mm"
    assert gemm_unit(k["kernel"].iloc[0]) == "CUDA cores"
    assert gemm_unit("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1") == "tensor cores"  # fmt: skip
    assert gemm_unit("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT") == "tensor cores"


def test_non_gemm_kernels_are_counted_per_point():
    nt = profile_rows.nontrivial_non_gemm(_kernels(), threshold=0.05)
    assert len(nt) == 2  # the two elementwise kernels, not merged
    assert (nt["points_at_or_above"] <= nt["of_points"]).all()
    assert set(nt["of_points"]) == {2}


def test_attention_split_keeps_the_scaling_out_of_the_matmul():
    points = pd.DataFrame(
        [
            {"size": "small", "context_length": c, "mode": "forward", "status": "ok",
             "d_model": 768, "num_heads": 12, "batch_size": 4}
            for c in (128, 256)
        ]
    )  # fmt: skip
    a = profile_rows.attention_split(points, _kernels())
    assert (a["qk_matmul_ms"] == 2.0).all() and (a["scale_ms"] == 1.0).all()
    units = profile_rows.attention_matmul_units(_kernels())
    assert set(units) == {"CUDA cores"}
    sentence = profile_answers.matmul_sentence(units, cpu_only=False)
    assert "CUDA cores as FFMA" in sentence and "tensor cores" in sentence  # "no tensor cores"
    assert "run on tensor cores" not in sentence


def test_a_row_naming_its_own_matmul_path_is_held_to_that_ceiling():
    """The engine's bf16 working weights run plain bf16 matmuls: its row (matmul_path
    'matmul') takes the plain bf16 ceiling, is not flagged for it, and gets a pipelined MFU;
    a plain-model bf16 row keeps autocast F.linear's."""
    from cs336_systems.stages.benchmark.mfu import add_mfu

    rows = pd.DataFrame(
        [
            {"precision": "bf16", "tflops": 0.05, "step_ms_mean": 10.0, "pipelined_ms": 8.0,
             "matmul_path": "matmul", "status": "ok"},
            {"precision": "bf16", "tflops": 0.5, "step_ms_mean": 10.0, "pipelined_ms": 10.0,
             "matmul_path": None, "status": "ok"},
        ]
    )  # fmt: skip
    out = add_mfu(rows, ceilings_rows(bf16=0.1, autocast=1.0))
    assert list(out["peak_path"]) == ["matmul", "autocast_linear"]
    assert out["mfu"].tolist() == pytest.approx([0.5, 0.5])
    assert out["pipelined_mfu"].tolist() == pytest.approx([0.625, 0.5])  # 10/8 of 0.5
    assert sanity.ceiling_path(out).fillna("").eq("").all()
    wrong = out.assign(peak_path=["autocast_linear", "autocast_linear"])
    assert "the model runs a plain matmul" in sanity.ceiling_path(wrong)[0]


def test_results_read_every_float_as_written(tmp_path, monkeypatch):
    """fp32's 0.01 printed digit by digit (the precision section) needs the exact double back
    from the CSV: round-trip parsing where pandas (before 3.0) parses approximately."""
    from cs336_systems.core import results

    path = tmp_path / "precision.csv"
    pd.DataFrame({"addend_stored": [0.009999999776482582, 0.01000213623046875]}).to_csv(
        path, index=False
    )
    assert list(load(tmp_path, "precision")["addend_stored"]) == [
        0.009999999776482582,
        0.01000213623046875,
    ]
    seen = {}
    monkeypatch.setattr(pd, "__version__", "2.2.3")
    monkeypatch.setattr(pd, "read_csv", lambda p, **kw: seen.update(kw) or pd.DataFrame())
    results.read_csv(path, usecols=["addend_stored"])
    assert seen == {"float_precision": "round_trip", "usecols": ["addend_stored"]}


def test_status_summary_counts_points_per_kind_ok_first():
    from cs336_systems.reporting.analysis import status_summary

    statuses = {
        "skipped: needs 142 GiB, have 79 GiB": 1,
        "ok": 4,
        "skipped: needs 180 GiB, have 79 GiB": 1,
        "oom": 2,
        "skipped: needs 157 GiB, have 79 GiB": 1,
    }
    assert status_summary(statuses) == "4 ok, 3 skipped, 2 oom"
    assert status_summary({"error: timeout after 5 s": 2}) == "2 error"


def test_the_copy_ceiling_is_named_for_the_machine(tmp_path):
    from cs336_systems.stages.ceilings import analysis as ceilings_analysis

    cpu = write_results(tmp_path / "cpu", ceilings=ceilings_rows())
    gpu = write_results(tmp_path / "gpu", ceilings=ceilings_rows(machine_kw={"gpus": 1}))
    assert ceilings_analysis.context(cpu)["copy_what"] == "copy within host memory"
    assert ceilings_analysis.context(gpu)["copy_what"] == "device-to-device copy"
    text = report.render(cpu, ["ceilings"])
    assert "device-to-device" not in text and "copy within host memory of" in text


# ------------------------------------------------------- flash: a pass slower than its whole


def _flash_rows(points: list[tuple], grid: str = "sweep") -> pd.DataFrame:
    """flash.csv rows: (impl, d, n, fwd, bwd, fwd+bwd medians in ms[, status])."""
    from fixture_rows import prov

    rows = []
    for impl, d, n, fwd, bwd, fb, *status in points:
        rows.append(
            {
                **prov(),
                "device": "cpu",
                "grid": grid,
                "impl": impl,
                "dtype": "bf16",
                "batch_size": 1,
                "heads": 16,
                "d_head": d,
                "seq_len": n,
                "status": status[0] if status else "ok",
                **{f"{p}_ms_median": v for p, v in (("fwd", fwd), ("bwd", bwd), ("fwd_bwd", fb))},
                **{f"{p}_ms_mean": v for p, v in (("fwd", fwd), ("bwd", bwd), ("fwd_bwd", fb))},
            }
        )
    return pd.DataFrame(rows)


def test_a_pass_slower_than_forward_plus_backward_is_suspect():
    df = _flash_rows(
        [
            ("flash_triton", 64, 128, 0.06, 0.38, 0.32),  # backward above forward+backward
            ("flash_triton", 64, 256, 0.50, 0.30, 0.40),  # forward above forward+backward
            ("flash_triton", 64, 512, 0.10, 0.30, 0.40),  # consistent
            ("flash_triton", 64, 1024, 0.10, 0.50, 0.40, "error: x"),  # did not run
        ]
    )
    # a mean one outlier pulled up is std_above_mean's: the check reads the median first
    df.loc[2, "bwd_ms_mean"] = 9.0
    out = sanity.flag(df, "flash")
    r = reasons(out)
    assert r[0] == (
        "suspect: backward slower than forward+backward: 0.380 > 0.320 ms "
        "(bwd_ms_median, fwd_bwd_ms_median)"
    )
    assert "forward slower than forward+backward: 0.500 > 0.400 ms (fwd_ms_median" in r[1]
    assert r[2] == "" and r[3] == ""
    assert list(out[sanity.SCOPE_COLUMN][:2]) == ["time", "time"]
    # without medians the means are compared; a CSV without the forward+backward is not checked
    means = df.drop(columns=[c for c in df if c.endswith("_median")])
    assert "(bwd_ms_mean, fwd_bwd_ms_mean)" in reasons(sanity.flag(means, "flash"))[2]
    ddp = pd.DataFrame({"status": ["ok"], "fwd_bwd_ms_median": [1.0], "step_ms_median": [9.0]})
    assert reasons(sanity.flag(ddp, "ddp")) == [""]
    assert "pass_slower_than_total" in [c["kind"] for c in sanity.checks_for("attention")]


def test_flash_sentences_and_target_leave_a_suspect_pass_out(tmp_path):
    from cs336_systems.stages.flash import analysis as flash_analysis

    sweep = _flash_rows(
        [
            ("naive_eager", 64, 128, 0.30, 0.60, 0.90),
            ("flash_triton", 64, 128, 0.06, 0.38, 0.32),  # suspect
            ("naive_eager", 64, 256, 0.40, 0.80, 1.20),
            ("flash_triton", 64, 256, 0.10, 0.30, 0.40),
        ]
    )
    target = _flash_rows(
        [
            ("flash_triton", 64, 1024, 0.06, 0.38, 0.32),  # suspect
            ("sdpa_cudnn", 64, 1024, 0.05, 0.15, 0.20),
            ("flash_triton", 64, 4096, 0.20, 0.50, 0.70),
            ("sdpa_cudnn", 64, 4096, 0.20, 0.40, 0.60),
        ],
        grid="target",
    )
    results = write_results(tmp_path / "r", flash=pd.concat([sweep, target], ignore_index=True))
    df = load(results, "flash")
    assert list(sanity.is_suspect(df)) == [False, True, False, False, True, False, False, False]
    # the speedup rests on the one point that passed, and the table marks the other
    (line,) = flash_analysis.speedup_sentences(df)
    assert "against naive (eager) on forward+backward: 3.00× faster" in line
    assert "(one point of 1: d=64, n=256)" in line
    table = flash_analysis.triton_vs_pytorch_table(df, "bf16")
    assert "0.380 ⚠" in table and "0.400 " in table  # 0.400, not 0.4
    fixed = flash_analysis.fixed_cost(df)
    assert "| 0.320 ⚠ " in fixed["table"] and "| suspect " in fixed["table"]
    assert fixed["sentences"] == [
        "The target holds at 0 of 1 points; not at d=64 n=4096 (1.17×) "
        "(1 suspect point excluded: see Suspect numbers)."
    ]


# --------------------------------------------------------------------------- number formats


def test_tables_print_numbers_as_fmt_wrote_them():
    from cs336_systems.reporting.analysis import md_table

    df = pd.DataFrame(
        {
            "ms": [0.2, 0.337, 8.066, 4.3],
            "count": [2.0, 3.0, float("nan"), 4.0],
            "cell": ["0.200", "0.058 ⚠", "1.55×", "–"],
            "big": [39_265_515.0, 1.5, 0.00008, 2289.0],
        }
    )
    lines = md_table(df, floatfmt=3).splitlines()
    # tabulate re-parsed every cell that looked like a number: 0.2 beside 0.337, 4.3, 3.93e+07
    assert [c.strip() for c in lines[2].split("|")[1:-1]] == ["0.200", "2", "0.200", "39,265,515"]
    assert [c.strip() for c in lines[4].split("|")[1:-1]] == ["8.066", "–", "1.55×", "0.000080"]
    assert [c.strip() for c in lines[5].split("|")[1:-1]] == ["4.300", "4", "–", "2,289"]
    # numbers right-aligned, text (a '–', a mark, a ×) left, as tabulate aligned them
    assert lines[1] == "|------:|:--------|:--------|-----------:|"
    assert md_table(pd.DataFrame({"v": ["13.0"]}), numparse=False).splitlines()[2] == "| 13.0 |"


def test_the_mfu_table_says_over_which_attentions_it_takes_the_best(tmp_path):
    """The table keeps each size's best training step: where several attention implementations
    ran, the heading names them (the H100 reference's small row was SDPA's, unsaid)."""
    import pandas as pd

    run = write_results(
        tmp_path / "results" / "fixture-cpu", benchmark=benchmark_rows(), ceilings=ceilings_rows()
    )
    s = benchmark_analysis.context(run)
    assert s["mfu_over"] == "naive"
    rows = pd.read_csv(run / "benchmark.csv")
    other = rows.assign(attention="sdpa")
    pd.concat([rows, other]).to_csv(run / "benchmark.csv", index=False)
    assert benchmark_analysis.context(run)["mfu_over"] == "naive, sdpa"
    text = report.render(run, ["ceilings", "benchmark"])
    assert "the best over its context lengths and attention implementations (naive, sdpa)" in text


def test_a_host_sensitive_row_measured_beside_other_jobs_names_them(tmp_path):
    """The job records (planning/neighbours.py) say which jobs overlapped: a host-bound or
    noisy row beside one is flagged with its neighbour's name; a GPU-bound, steady row beside
    one, and any row of a job that ran alone, are not."""
    records = tmp_path / "jobs" / "records"
    for job, what, start, end in [
        ("a", "fsdp results/m/fsdp/bf16.csv", 0.0, 100.0),
        ("b", "benchmark results/m/benchmark/points/xl.csv", 50.0, 150.0),
        ("c", "ddp results/m/ddp/variants.csv", 200.0, 300.0),
    ]:
        neighbours.write(records, {"job": job, "what": what, "start": start, "end": end})
    df = pd.DataFrame(
        {
            "status": ["ok"] * 4,
            "job_id": ["a", "a", "b", "c"],
            "gpu_count": [4, 4, 1, 4],
            "prof_gpu_busy_ms": [40.0, 95.0, None, 40.0],
            "prof_step_ms": [100.0, 100.0, None, 100.0],
            "step_ms_mean": [100.0, 100.0, 80.0, 100.0],
            "step_ms_std": [1.0, 1.0, 6.0, 1.0],
        }
    )
    out = sanity.flag(df, "any", results_dir=tmp_path)
    flagged = out[sanity.BESIDE].tolist()
    assert "measured beside benchmark results/m/benchmark/points/xl.csv" in flagged[0]
    assert "host-bound: its GPU busy 40%" in flagged[0]
    assert flagged[1] == ""  # GPU-bound and steady: its neighbour does not move it
    assert "beside fsdp results/m/fsdp/bf16.csv (spread: step_ms_std 8% of its mean)" in flagged[2]
    assert flagged[3] == ""  # host-bound, but it ran alone
    # disclosed, not doubted: kept for sentences, listed beside the suspect rows
    assert len(ok(out)) == 4
    listed = sanity.suspect_rows(out, "any")
    assert len(listed) == 2 and listed["why"].iloc[0].startswith("kept, but measured beside")
    # without records (a run before they existed), nothing is named
    none = sanity.flag(df, "any", results_dir=tmp_path / "none")
    assert none[sanity.BESIDE].tolist() == [""] * 4


def test_a_point_the_host_bound_rule_fires_on_is_host_sensitive_beside_others(tmp_path):
    """A steady benchmark row with no profile is still host-sensitive where the one host-bound
    rule fires on its point (bf16 no faster than fp32 under a 3x higher ceiling): beside
    another job it is flagged, both precisions; a point bf16 speeds up 3x is not."""
    records = tmp_path / "jobs" / "records"
    neighbours.write(records, {"job": "a", "what": "benchmark small", "start": 0.0, "end": 9.0})
    neighbours.write(records, {"job": "b", "what": "flash target", "start": 5.0, "end": 20.0})
    point = {"size": "small", "context_length": 512, "compile": "eager", "mode": "forward"}
    df = pd.DataFrame(
        [
            {**point, "attention": att, "precision": p, "step_ms_mean": t, "step_ms_std": 0.1,
             "peak_tflops": peak, "status": "ok", "job_id": "a", "gpu_count": 1}
            for att, p, t, peak in [
                ("flash_triton", "fp32", 19.5, 54.0), ("flash_triton", "bf16", 28.8, 668.0),
                ("naive", "fp32", 60.0, 54.0), ("naive", "bf16", 20.0, 668.0),
            ]
        ]
    )  # fmt: skip
    flagged = sanity.flag(df, "any", results_dir=tmp_path)[sanity.BESIDE].tolist()
    assert "beside flash target (host-bound: bf16 0.68x as fast as fp32" in flagged[0]
    assert flagged[0] == flagged[1]
    assert flagged[2:] == ["", ""]
