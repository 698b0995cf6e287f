"""The benchmark stage on CPU: per-phase timings within a step, the edition's model columns on
every row, and a point the memory model says cannot fit is a `skipped` row decided before
anything is allocated."""

from __future__ import annotations

import json
import math
import os

import pandas as pd
import pytest
import torch
from pipeline_utils import block

from cs336_systems.core import costs
from cs336_systems.stages.benchmark import measure as bench
from cs336_systems.stages.benchmark import plan as bench_plan

CPU = torch.device("cpu")


def grid(modes, precisions=("fp32",), edition=2026, size="tiny", steps=4, **kw):
    return bench.run_grid(
        size,
        32,
        list(modes),
        list(precisions),
        ["eager"],
        "naive",
        2,
        1,
        steps,
        CPU,
        {"machine": "test", "edition": edition},
        edition=edition,
        **kw,
    )


def test_the_hf_peer_runs_in_full_and_in_2025_not_in_the_2026_gpu_preset():
    """The compiled HuggingFace peer costs most of a minute of the xl job: the 2026 gpu preset
    leaves it to `full`; 2025's gpu run compiles it at small."""

    def engines(preset, edition=None):
        k = bench_plan.KNOBS.from_block(json.loads(block("benchmark", preset, edition)[1]))
        return bench_plan.engines_arg(k, k.attentions[0])

    assert engines("gpu") == "plain,fast"
    assert engines("gpu", 2025) == engines("full") == "plain,fast,hf_gpt2"


def test_the_hf_peer_is_built_on_the_default_device_of_its_step():
    """The HuggingFace peer's weights are made where the step runs (`with device:`), not on the
    host and copied: on the meta device its layers are made there."""
    pytest.importorskip("transformers")
    from cs336_systems.stages.benchmark import engines

    made = []
    real = torch.nn.Linear.__init__

    def spy(self, *a, **kw):
        real(self, *a, **kw)
        made.append(self.weight.device.type)

    step = engines.hf_step("tiny", 32, 2, torch.device("cpu"), "fp32", False)
    step()  # one training step runs
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.Linear, "__init__", spy)
        mp.setattr(engines, "_batch", lambda *a: (None, None))
        engines.hf_step("tiny", 32, 2, torch.device("meta"), "fp32", False)
    assert made and set(made) == {"meta"}


def test_each_job_reads_its_part_of_the_block(capsys):
    run = ["--machine", "m", "--preset", "gpu", "--out", "x"]
    cfg = json.loads(block("benchmark", "gpu")[1])
    k = bench_plan.KNOBS.from_block(cfg)
    point = ["run", "--size", "xl", "--context-length", "512", "--attention", "naive", *run]
    point += ["--compile", bench_plan.compile_arg(k, "xl", 512, "naive")]
    point += ["--engines", bench_plan.engines_arg(k, "naive")]
    args = bench.parse_args([*point, "--block", json.dumps(bench_plan.run_block(k))])
    knobs, modes = args.block, ["forward", "forward_backward", "train_step"]
    assert (knobs.modes, knobs.precisions) == (modes, ["fp32", "bf16"])
    assert (args.compile, args.engines) == ("eager,compiled", "plain,fast")
    assert (knobs.compile_only.modes, knobs.compile_only.precisions) == (modes, ["bf16"])
    assert (knobs.compile_mode or bench.COMPILE_MODE) == "default"
    assert (knobs.batch_size, knobs.warmup_steps, knobs.measure_steps) == (4, 5, 10)
    assert knobs.max_point_s is None
    # another size in the sweep, or another sweep, changes no point job's block
    other = {**cfg, "sizes": ["small"], "warmup_sweep": {**cfg["warmup_sweep"], "warmups": [0]}}
    assert bench_plan.run_block(bench_plan.KNOBS.from_block(other)) == bench_plan.run_block(k)
    # the warm-up sweep's job reads the sweep and the batch size
    warm = [
        "warmup",
        "--size",
        "small",
        *run,
        *block("benchmark", "gpu", part=bench_plan.WARMUP_KNOBS),
    ]
    args = bench.parse_args(warm)
    sweep = args.block.warmup_sweep
    assert (sweep.context_length, sweep.warmups, sweep.measure_steps) == (512, [0, 1, 2, 5], 10)
    assert (sweep.mode, sweep.precision, args.block.batch_size) == ("train_step", "fp32", 4)
    # the whole block is not a job's part
    with pytest.raises(SystemExit):
        bench.parse_args([*point, *block("benchmark", "gpu")])
    assert "config: block.sizes: " in capsys.readouterr().err


def test_phases_of_a_training_step_add_up_to_the_step():
    rows = grid(["forward", "forward_backward", "train_step"])
    by_mode = {r["mode"]: r for r in rows}
    assert all(r["status"] == "ok" for r in rows), [r["status"] for r in rows]
    step = by_mode["train_step"]
    for phase in ("fwd", "bwd", "opt"):
        assert step[f"{phase}_ms_median"] > 0, phase
    # the marks lie inside the synchronized step: the phases' means sum to at most the step's
    # mean (host clock on a CPU), and to most of it (only zero_grad and the clock are outside)
    total = step["fwd_ms_mean"] + step["bwd_ms_mean"] + step["opt_ms_mean"]
    assert total <= step["step_ms_mean"] * 1.0001
    assert total >= 0.7 * step["step_ms_mean"], (total, step["step_ms_mean"])
    # a mode's missing phases are NaN, not zero
    assert math.isnan(by_mode["forward"]["bwd_ms_median"])
    assert math.isnan(by_mode["forward"]["opt_ms_median"])
    assert math.isnan(by_mode["forward_backward"]["opt_ms_median"])
    fb = by_mode["forward_backward"]
    assert fb["fwd_ms_mean"] + fb["bwd_ms_mean"] <= fb["step_ms_mean"] * 1.0001
    assert len(json.loads(step["step_times_ms"])) == 4


def test_rows_carry_the_edition_and_the_resolved_model():
    (row,) = grid(["forward"], steps=1)
    assert row["edition"] == 2026 and row["size"] == "tiny"
    assert (row["d_model"], row["d_ff"], row["num_layers"], row["num_heads"]) == (128, 512, 2, 4)
    assert row["params"] == costs.param_count(10_000, 128, 2, 512)
    # the same name resolves per edition: 2026 xl is 2025's 2.7B
    xl26 = bench.model_row("xl", 512, 4, 2026)
    xl25 = bench.model_row("xl", 512, 4, 2025)
    assert xl26["params"] == 3_406_809_600 == bench.model_row("2.7B", 512, 4, 2025)["params"]
    assert xl25["params"] == 1_998_235_200 and xl25["num_layers"] == 48
    assert bench.model_row("10B", 512, 4, 2026)["params"] == 12_832_823_808


def test_the_memory_model_counts_16_bytes_a_parameter_for_a_train_step():
    s = {"d_model": 4608, "d_ff": 12288, "num_layers": 50, "num_heads": 36}
    n = 12_832_823_808
    need = {
        m: costs.step_memory_bytes(
            10_000, s["d_model"], s["num_layers"], s["num_heads"], s["d_ff"], 4, 512, m
        )
        for m in ("forward", "forward_backward", "train_step")
    }
    assert need["train_step"]["state_bytes"] == 16 * n  # ~205 GB: no 80 GB GPU holds it
    assert need["forward_backward"]["state_bytes"] == 8 * n
    assert need["forward"]["state_bytes"] == 4 * n
    acts = need["train_step"]["activation_bytes"]
    assert acts == need["forward"]["activation_bytes"] > 0
    block = costs.block_saved_bytes(4, 512, 4608, 36, 12288)["total"]
    assert acts == 50 * block + costs.head_saved_bytes(4, 512, 4608, 10_000)
    assert need["train_step"]["total_bytes"] > 80e9


def test_a_point_that_cannot_fit_is_skipped_before_allocating(monkeypatch):
    # a device with 300 MiB free: the tiny model's forward fits, small's training step
    # (128.6 M parameters x 16 B = 1.9 GiB) does not
    monkeypatch.setattr(bench, "free_memory_mib", lambda device: 300.0)
    built = []
    real_build = bench.Workload.build
    monkeypatch.setattr(
        bench.Workload, "build", lambda *a, **k: built.append(a) or real_build(*a, **k)
    )
    rows = grid(["forward", "train_step"], size="small", steps=1)
    assert [r["status"].split(":")[0] for r in rows] == ["skipped", "skipped"]
    assert not built  # nothing allocated: no point could fit
    need = bench.step_memory_mib("small", 32, 2, "train_step", "fp32", "cpu", 2026)
    assert need > 16 * 128_625_408 / 2**20
    step = rows[1]
    assert step["status"] == (
        f"skipped: small train step in fp32 (state + saved activations) needs {need:,.0f} MiB; "
        "300 MiB free on cpu"
    )
    assert step["needed_memory_mb"] == pytest.approx(need) and step["free_memory_mb"] == 300.0
    # a point that fits beside one that does not: the model is built for the one that fits
    monkeypatch.setattr(bench, "free_memory_mib", lambda device: 40.0)
    rows = grid(["forward", "train_step"], steps=1)
    assert [r["status"].split(":")[0] for r in rows] == ["ok", "skipped"]
    assert len(built) == 1


def test_the_report_answers_with_the_three_phases_for_every_size_of_the_edition(
    tmp_path, monkeypatch
):
    from fixture_rows import prov

    from cs336_systems.core.results import write_csv
    from cs336_systems.reporting import report

    # tiny runs; small's training step cannot fit 60 MiB: a skipped row the table shows
    monkeypatch.setattr(bench, "free_memory_mib", lambda device: 60.0)
    rows = []
    for size in ("tiny", "small"):
        rows += bench.run_grid(
            size,
            32,
            ["train_step"],
            ["fp32"],
            ["eager"],
            "naive",
            2,
            2,
            5,
            CPU,
            prov(),
            edition=2026,
        )
    results = tmp_path / "results" / "fixture-cpu"
    write_csv(rows, results / "benchmark.csv")
    text = report.render(results, ["benchmark"])

    section = text.split('<a id="benchmark"></a>', 1)[1]
    assert "_Answers the 2026 edition (its rows' `edition`)._" in section
    assert "Forward, backward and optimizer step (2026 edition)" in section
    assert (
        "context 32 is the one nearest the handout's 512, which this run did not measure" in section
    )
    assert "(the host clock)" in section and "CUDA events" not in section
    table = section.split("fp32:", 1)[1].split("- fp32:", 1)[0]
    lines = [line for line in table.splitlines() if line.startswith("| ")][1:]
    assert [line.split("|")[1].strip() for line in lines] == [
        "tiny",
        "small",
        "medium",
        "large",
        "xl",
        "10B",
    ]
    tiny = next(r for r in rows if r["size"] == "tiny")
    # the tiny row's medians, unless a noisy shared CPU made the sanity checks drop it
    if "suspect" not in lines[0]:
        cells = [c.strip() for c in lines[0].split("|")[2:6]]
        assert cells == [
            report.fmt(tiny[f"{p}_ms_median"], 2) for p in ("fwd", "bwd", "opt", "step")
        ]
        assert "- fp32: the optimizer step takes" in section
    assert "skipped: small train step in fp32" in lines[1] and "not run" in lines[5]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_phases_on_cuda_add_up_to_the_step():
    """On a GPU the phases are CUDA events between marks inside the synchronized step."""
    rows = bench.run_grid(
        "small",
        128,
        ["train_step"],
        ["fp32"],
        ["eager"],
        "naive",
        4,
        2,
        5,
        torch.device("cuda"),
        {},
        edition=2026,
    )
    (row,) = rows
    assert row["status"] == "ok", row["status"]
    total = row["fwd_ms_mean"] + row["bwd_ms_mean"] + row["opt_ms_mean"]
    assert 0.8 * row["step_ms_mean"] <= total <= 1.01 * row["step_ms_mean"]
    assert row["opt_ms_median"] > 0 and row["bwd_ms_median"] > row["fwd_ms_median"]


def _goal_rows(opt_ms: float | None) -> pd.DataFrame:
    base = {"size": "xl", "context_length": 512, "precision": "bf16", "compile": "compiled",
            "attention": "naive", "engine": "plain", "params": 1e9, "tflops": 300.0,
            "mfu": 0.5, "peak_tflops": 600.0}  # fmt: skip
    rows = [
        {**base, "mode": "forward", "step_ms_mean": 30.0},
        # a forward_backward mode adding into the last step's gradients: 80 ms of backward, not 60
        {**base, "mode": "forward_backward", "step_ms_mean": 110.0},
        {
            **base,
            "mode": "train_step",
            "step_ms_mean": 130.0,
            "fwd_ms_mean": 30.0,
            "bwd_ms_mean": 60.0,
            "opt_ms_mean": opt_ms if opt_ms is not None else math.nan,
        },  # fmt: skip
        {**base, "mode": "train_step", "engine": "fast", "step_ms_mean": 90.0},
    ]
    return pd.DataFrame(rows)


def test_goal_breakdown_splits_the_step_by_its_own_marks_and_flags_the_impossible():
    """The goal point's forward/backward/optimizer split comes from the step's phase marks (the
    modes' difference would give 20 ms of optimizer, below the byte floor); without marks the
    difference is used and, being below the floor, shown as suspect."""
    from cs336_systems.stages.benchmark.answers import ADAMW_BYTES_PER_PARAM, goal_breakdown

    ceilings = pd.DataFrame([{"kind": "copy", "status": "ok", "gbps": 1000.0}])
    floor_ms = ADAMW_BYTES_PER_PARAM * 1e9 / 1e12 * 1e3  # 28 ms at 1000 GB/s
    (text,) = goal_breakdown(_goal_rows(40.0), ceilings)
    assert "130.0 ms per step" in text and "timed between marks" in text
    assert "backward 60.0 ms and the optimizer 40.0 ms" in text
    assert f"floor of {floor_ms:.1f} ms" in text and "suspect" not in text
    assert "-10.0 ms" not in text  # 30 + 60 + 40 = the 130 ms step: nothing left, nothing over
    # the parts must add to the step: 30 + 60 + 45 ms of a 130 ms step is flagged with the gap
    (text,) = goal_breakdown(_goal_rows(45.0), ceilings)
    assert "**suspect**: the three exceed the step by 5.0 ms" in text
    (text,) = goal_breakdown(_goal_rows(None), ceilings)
    assert "differences of the forward" in text and "optimizer 20.0 ms" in text
    assert "**suspect**" in text


def test_speedup_sentence_with_excluded_pairs_closes_its_parenthesis():
    from cs336_systems.stages.benchmark.analysis import speedup_summary

    sp = pd.DataFrame(
        [
            {
                "size": "small",
                "context_length": 512,
                "mode": "forward",
                "attention": "naive",
                "speedup": s,
            }
            for s in (0.8, 1.5)
        ]  # fmt: skip
    )
    text = speedup_summary(sp, "bf16 over fp32", n_excluded=6)["sentence"]
    assert text.endswith("(median, range; 6 suspect pairs excluded: see Suspect numbers).")
    assert text.count("(") == text.count(")")
    assert "0.80–1.50× across 2 points" in text
    # one point: no median, no range, no "1 points"
    text = speedup_summary(sp.head(1), "bf16 over fp32", n_excluded=0)["sentence"]
    assert text == "bf16 over fp32: 0.80× (one point)."
    assert speedup_summary(sp, "x")["losers"].startswith(
        "It does not pay (speedup below 1) at 1 point of 2: small ctx 512 forward"
    )
    assert "at any measured point:" in speedup_summary(sp.head(1), "x")["losers"]


def test_forward_backward_steps_write_fresh_gradients():
    """forward_backward sets the gradients to None before each step, as train_step does: two
    steps leave one backward's gradients, not their sum (a backward adding into the last
    step's would cost one more read and write of every gradient)."""
    from cs336_systems.core.workload import Workload

    torch.manual_seed(0)
    work = Workload.build("tiny", 16, 2, "cpu")
    step, cleanup = work.step("forward_backward", "fp32", False)
    step()
    once = [p.grad.clone() for p in work.model.parameters()]
    step()
    for p, g in zip(work.model.parameters(), once, strict=True):
        assert torch.allclose(p.grad, g)
    cleanup()
    assert all(p.grad is None for p in work.model.parameters())


def test_each_warmup_count_runs_in_a_process_of_its_own(tmp_path):
    """The warm-up sweep starts one process per count: no count inherits what an earlier one
    warmed (libraries, kernels, the allocator's pool), and a row names its process."""
    sweep = {"sizes": ["tiny"], "context_length": 16, "warmups": [0, 2], "measure_steps": 1,
             "mode": "forward", "precision": "fp32"}  # fmt: skip
    out = tmp_path / "w.csv"
    bench.main([
        "warmup", "--size", "tiny", "--machine", "m", "--preset", "cpu", "--out", str(out),
        "--block", json.dumps({"batch_size": 1, "warmup_sweep": sweep}),
    ])  # fmt: skip
    rows = pd.read_csv(out)
    assert list(rows["warmup_steps"]) == [0, 2] and set(rows["status"]) == {"ok"}
    pids = set(rows["process_id"])
    assert len(pids) == 2 and os.getpid() not in pids
    assert [len(json.loads(w)) for w in rows["warmup_times_ms"]] == [0, 2]


@pytest.mark.parametrize("engines", [("fast",), ("fast", "hf_gpt2")])
def test_the_engines_paragraph_names_the_hf_peer_only_where_it_ran(tmp_path, engines):
    from fixture_rows import prov

    from cs336_systems.core.results import write_csv
    from cs336_systems.reporting import report

    rows = bench.run_grid(
        "tiny", 32, ["train_step"], ["fp32"], ["eager"], "naive", 1, 2, 5, CPU, prov(),
        edition=2026,
    )  # fmt: skip
    rows = [{**r, "engine": "plain"} for r in rows]
    rows += [{**rows[0], "engine": e} for e in engines]
    results = tmp_path / "results" / "fixture-cpu"
    write_csv(rows, results / "benchmark.csv")
    section = report.render(results, ["benchmark"]).split('<a id="benchmark"></a>', 1)[1]
    assert "fast (ms) |" in section
    ran = "hf_gpt2" in engines
    assert ("and a HuggingFace GPT-2 of the same width" in section) == ran
    assert ("is not in this run's `engines`: the `full` preset runs it" in section) == (not ran)
