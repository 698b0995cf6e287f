"""The fsdp stage: its rows, its skipped rows with the command to run them, its report context;
and the memory formulas of core/costs.py it answers question 32 with."""

from __future__ import annotations

import json
import shlex

import pytest
from pipeline_utils import block

from cs336_systems.core.costs import fsdp_saving_vs_optimizer_sharding, training_state_bytes
from cs336_systems.core.results import provenance, write_csv
from cs336_systems.reporting.analysis import placeholder_reason
from cs336_systems.stages.fsdp import analysis
from cs336_systems.stages.fsdp import answers as q33
from cs336_systems.stages.fsdp import measure as stage


def test_training_state_formulas():
    s, r, w = 1000, 10, 4
    n = s + r
    assert training_state_bytes(s, r, w, "ddp") == 16 * n
    assert training_state_bytes(s, r, w, "sharded_optimizer") == 8 * n + 8 * n / w
    assert training_state_bytes(s, r, w, "fsdp") == 16 * s / w + 16 * r
    # FSDP saves the sharded weights' parameters and gradients, 8 (1 - 1/W) bytes each, but
    # keeps the replicated parameters' optimizer state whole (8 (1 - 1/W) bytes each more)
    saving = 8 * s * (1 - 1 / w) - 8 * r * (1 - 1 / w)
    assert fsdp_saving_vs_optimizer_sharding(s, r, w) == pytest.approx(saving)
    with pytest.raises(ValueError):
        training_state_bytes(s, r, w, "zero3")


def test_too_few_gpus_gives_skipped_rows_with_the_command(tmp_path, monkeypatch):
    import cs336_systems.parallel.launch as launch

    monkeypatch.setattr(launch, "gpu_count", lambda: 1)
    knobs = block("fsdp", backend="nccl", size="xl", variants=list(stage.VARIANTS))
    argv = ["--machine", "m", "--preset", "gpu", *knobs, "--out", str(tmp_path / "runs.csv")]
    args = stage.parse_args(argv)
    rows = stage.run(args, argv)
    assert [r["variant"] for r in rows] == list(stage.VARIANTS)
    assert {r["status"] for r in rows} == {"skipped: needs 2 GPUs, found 1"}
    command = rows[0]["command"]
    assert command.startswith("python3 -m cs336_systems.stages.fsdp ")
    # the command runs the same block again
    rerun = stage.parse_args(shlex.split(command)[3:])
    assert rerun.block == args.block and (rerun.block.backend, rerun.block.size) == ("nccl", "xl")
    write_csv([{**provenance("m", "gpu"), **r} for r in rows], tmp_path / "fsdp.csv")
    ctx = analysis.context(tmp_path)
    assert "needs 2 GPUs, found 1" in ctx["skipped"] and ctx["commands"] == [command]
    assert ctx["n_ok"] == 0
    *figures, hta = analysis.plot(tmp_path, tmp_path / "figures")
    assert [p.name for p in figures] == ["fsdp_memory.png", "fsdp_time.png", "fsdp_timeline.png"]
    # the timeline's note names why its runs did not run
    assert "needs 2 GPUs, found 1" in placeholder_reason(figures[-1])
    # HTA's reading kept for the report: no run kept a trace
    assert hta == tmp_path / "fsdp" / "hta.json"
    assert "No profiled step kept its traces" in json.loads(hta.read_text())["result"]["hta_empty"]


@pytest.mark.slow
def test_stage_runs_and_answers_both_questions(tmp_path):
    """Two gloo ranks, a tiny model, one step each: rows, tensor accounting, overlap, report
    (bf16 compute halving the gathered bytes is checked in test_fsdp.py)."""
    out = tmp_path / "runs.csv"
    knobs = block(
        "fsdp", backend="gloo", world_size=2, size="tiny", context_length=8, batch_per_rank=1,
        variants=["sharded_optimizer", "fsdp", "torch_fsdp_bf16"], warmup_steps=0,
        measure_steps=1, profile=True, timeout_s=240,
    )  # fmt: skip
    raw = tmp_path / "fsdp" / "raw"  # where the rule keeps them, beside the report's reading
    argv = ["--machine", "m", "--preset", "cpu", *knobs, "--trace-dir", str(raw),
            "--out", str(out)]  # fmt: skip
    stage.main(argv)
    import pandas as pd

    df = pd.read_csv(out)
    assert list(df["status"]) == ["ok"] * 3, df["status"].tolist()
    rows = {r.variant: r for r in df.itertuples()}
    fs, so, peer = rows["fsdp"], rows["sharded_optimizer"], rows["torch_fsdp_bf16"]
    # the peer (PyTorch's FSDP2) shards every parameter: a rank holds its local shards, half
    # of the model with two ranks (its padding aside), gradients and AdamW's moments alike
    total = int(peer.sharded_params)
    assert peer.replicated_params == 0 and total == fs.sharded_params + fs.replicated_params
    assert peer.params_mb * 2**20 == pytest.approx(4 * total / 2, rel=0.01)
    assert peer.held_mb == pytest.approx(fs.held_mb, rel=0.01)
    assert peer.prof_all_gather_ms > 0 and not peer.collectives_counted
    # the tensors FSDP holds per rank are exactly the analytic state plus the flat buffers'
    # alignment padding (params, grads and AdamW's two moments: 16 bytes an element)
    expect = training_state_bytes(int(fs.sharded_params), int(fs.replicated_params), 2, "fsdp")
    expect += 16 * int(fs.fsdp_pad_elems)
    assert 0 <= fs.fsdp_pad_elems < 64 * 20  # under 64 a member (tiny's sizes: none)
    assert fs.held_mb * 2**20 == pytest.approx(expect, abs=1024)  # + AdamW's step counters
    assert fs.held_mb < so.held_mb
    assert fs.all_gather_into_tensor_calls > 0 and so.all_gather_into_tensor_calls == 0
    assert fs.prof_all_gather_ms > 0 and 0 <= fs.prof_all_gather_overlap_share <= 1
    # forward and backward all-gathers apart (tiny: 16 layers gathered forward, 15 backward)
    assert fs.prof_all_gather_fwd_ms > 0 and fs.prof_all_gather_bwd_ms > 0
    assert 0 < fs.gathered_peak_mb < fs.params_mb * 2
    assert {p.name for p in (raw / "fsdp_fsdp").iterdir()} == {
        "rank0.json.gz",
        "rank1.json.gz",
    }
    write_csv(df, tmp_path / "fsdp.csv")
    ctx = analysis.context(tmp_path)
    assert "expected saving" in ctx["q32_details"] and "By phase: forward" in ctx["q33_details"]
    assert "not counted" in next(x for x in ctx["time_table"].splitlines() if "FSDP2" in x)
    assert ctx["analytic_table"] and ctx["memory_table"] and ctx["time_table"]
    # the traces' folders, and why HolisticTraceAnalysis has nothing beside ours on the CPU
    assert f"{tmp_path}/fsdp/raw/fsdp_fsdp/" in ctx["traces"]
    assert "hold no GPU kernels" in ctx["hta_empty"] and "gloo's collectives" in ctx["hta_empty"]


def _fsdp_rows():
    """A CPU run's fsdp.csv: every run ran; DDP's forward time has a std above its mean
    (std_above_mean flags it on load; a sync time's std above its mean is not flagged: that wait
    is skewed by nature, see the stage's SANITY)."""
    import pandas as pd
    from fixture_rows import prov

    nan = float("nan")
    common = {
        **prov(),
        "backend": "gloo",
        "device": "cpu",
        "world_size": 2,
        "size": "tiny",
        "params": 3_084_928,
        "d_model": 128,
        "d_ff": 512,
        "num_layers": 2,
        "context_length": 32,
        "batch_per_rank": 2,
        "status": "ok",
        "warmup_steps": 1,
        "measure_steps": 2,
        "sharded_params": 3_084_288,
        "replicated_params": 640,
        "step_ms_std": 5.0,
        "fwd_ms_mean": 20.0,
        "bwd_ms_mean": 40.0,
        "opt_ms_mean": 10.0,
        "mem_step_peak_mb": nan,
    }
    # variant, step, comm mean, comm std, params/grads MB, optimizer state MB, gathered MB
    runs = [
        ("ddp", 90.0, 40.0, 60.0, 11.77, 23.54, 0.0),
        ("sharded_optimizer", 130.0, 26.0, 5.0, 11.77, 13.77, 0.0),
        ("fsdp", 150.0, 10.0, 2.0, 5.89, 11.77, 5.13),
        ("fsdp_bf16", 360.0, 6.0, 1.0, 5.89, 11.77, 2.57),
    ]
    rows = []
    for v, step, comm, comm_std, pg, state, gathered in runs:
        fsdp = v.startswith("fsdp")
        rows.append(
            {
                **common,
                "variant": v,
                "step_ms_mean": step,
                "comm_ms_mean": comm,
                "comm_ms_std": comm_std,
                "fwd_ms_std": 30.0 if v == "ddp" else 1.0,
                "params_mb": pg,
                "grads_mb": pg,
                "optimizer_state_mb": state,
                "held_mb": 2 * pg + state,
                "gathered_peak_mb": gathered,
                "all_gather_into_tensor_calls": 31 if fsdp else 0,
                "all_gather_into_tensor_mb": 18.65 / (2 if v == "fsdp_bf16" else 1) * fsdp,
                "prof_all_gather_ms": 75.0 if fsdp else nan,
                "prof_all_gather_overlapped_ms": 6.0 if fsdp else nan,
                "prof_all_gather_overlap_share": 0.08 if fsdp else nan,
                "gather_wait_ms_mean": 50.0 if fsdp else nan,
            }
        )
    return pd.DataFrame(rows)


def test_report_shows_the_suspect_run_marked_and_keeps_it_out_of_sentences(tmp_path):
    from fixture_rows import write_results

    from cs336_systems.reporting import report

    results = write_results(tmp_path / "results" / "fixture-cpu", fsdp=_fsdp_rows())
    ctx = analysis.context(results)
    assert (ctx["n_ok"], ctx["n_points"], ctx["failed_table"]) == (4, 4, "")
    row = next(x for x in ctx["time_table"].splitlines() if x.startswith("| DDP  "))
    assert "90.00 ± 5.00 ⚠ suspect" in row
    assert "DDP ⚠ suspect" in ctx["memory_table"].splitlines()[0]
    assert "| DDP ⚠ suspect" in ctx["analytic_table"]
    # Q33 compares FSDP with DDP only on a DDP run that passed the checks, and says so
    assert "Against DDP" not in ctx["q33_details"]
    assert ctx["q33_details"].endswith(
        "Left out of this answer: DDP (1 suspect point excluded: see Suspect numbers)."
    )
    section = report.render(results, ["fsdp"]).split('<a id="fsdp"></a>', 1)[1]
    assert "4 of 4 runs succeeded." in section
    assert "Runs that did not succeed" not in section and "_(no rows)_" not in section
    assert "allocator peaks were not measured" in section


def _gather_row(backend: str = "gloo", wait: float = 90.0, **over) -> dict:
    """One FSDP run's profiled-gather and wait columns: gathers 80 ms on the timeline, 30 of
    them during compute (50 exposed); every collective 140 ms, 60 during compute (30 ms with
    only other collectives running outside compute)."""
    return {
        "backend": backend,
        "step_ms_mean": 400.0,
        "measure_steps": 2,
        "gather_wait_ms_mean": wait,
        "gather_wait_ms_min": wait - 2,
        "gather_wait_ms_max": wait + 2,
        "prof_all_gather_ms": 80.0,
        "prof_all_gather_overlapped_ms": 30.0,
        "prof_all_gather_overlap_share": 30.0 / 80.0,
        "prof_comm_ms": 140.0,
        "prof_comm_overlapped_ms": 60.0,
        **over,
    }


def test_a_wait_longer_than_the_exposed_gathers_says_what_it_counts_and_why():
    import pandas as pd

    text = q33._wait_sentence(pd.Series(_gather_row()))
    assert text.startswith(
        " That wait is 22.5% of the 400 ms step (mean of 2 timed steps, 88.00–92.00 ms), "
        "counted from each wait() call until its gather had completed."
    )
    assert (
        "That is 40.00 ms more than the gathers' 50.00 ms exposed on the timeline, even more "
        "than their whole 80.00 ms: gloo runs collectives" in text
    )
    assert "queued behind earlier collectives" in text and "one more, profiled step" in text
    assert "30.00 ms of the profiled step had only those running and no compute" in text
    # a second run gives only the numbers; the reasons are not repeated
    again = q33._wait_sentence(pd.Series(_gather_row(wait=60.0)), explained=True)
    assert (
        "That is 10.00 ms more than the gathers' 50.00 ms exposed on the timeline, for the "
        "same reasons (30.00 ms of the profiled step had only other collectives" in again
    )
    assert "even more" not in again and "gloo runs" not in again


def test_a_wait_within_the_exposed_time_and_a_gpu_wait_say_no_more():
    import pandas as pd

    within = q33._wait_sentence(pd.Series(_gather_row(wait=45.0)))
    assert "counted from each wait() call" in within and "That is" not in within
    gpu = q33._wait_sentence(pd.Series(_gather_row(backend="nccl", wait=0.5)))
    assert gpu == (
        " On the GPU a gather's wait() only makes the compute stream wait for it, so the host's "
        "0.50 ms per step in those calls is not time the step loses; the 50.00 ms they ran "
        "outside compute is the most it can lose to them (how long compute waited for them is "
        "not measured)."
    )
    assert q33._wait_sentence(pd.Series(_gather_row(wait=float("nan")))) == ""


def test_q33_gives_the_reasons_a_wait_exceeds_the_exposed_time_once():
    df = _fsdp_rows()
    for col, value in _gather_row().items():
        if col not in ("backend", "step_ms_mean"):
            df[col] = [value if v.startswith("fsdp") else float("nan") for v in df["variant"]]
    text = q33.q33(df)
    assert text.count("counted from each wait() call") == 2
    assert text.count("gloo runs collectives on its worker threads") == 1
    assert text.count("for the same reasons") == 1


def test_the_verdict_rests_on_the_wait_and_time_outside_compute_is_not_called_lost():
    """The CPU reference's fp32 run: gathers 29.22 ms, 17.8% during compute, yet the main
    thread waited 7.40 ms for them: in time only in part, not "most of their time is
    exposed". The four-H200 bf16 run: compute never waited, 21.82 ms outside compute: that
    time is neither called what the step loses nor quoted as a cost."""
    import pandas as pd

    calls = {"all_gather_into_tensor_mb": 18.65, "all_gather_into_tensor_calls": 7}
    cpu = pd.Series(
        _gather_row(wait=7.40, step_ms_mean=51.63, prof_all_gather_ms=29.22,
                    prof_all_gather_overlapped_ms=5.19, prof_all_gather_overlap_share=0.178,
                    prof_comm_ms=40.0, prof_comm_overlapped_ms=10.0, **calls)
    )  # fmt: skip
    assert q33.gather_verdict(cpu) == "they finish in time only in part"
    text = q33._gather_sentence(cpu, "FSDP (fp32)")
    assert "the main thread, which runs the compute, waited for them 7.40 ms (25.3% of their" in (
        text
    )
    assert "most of their time is exposed" not in text
    assert "16.63 ms of the 24.03 ms they ran outside compute fell where the main thread ran" in (
        text
    )
    assert "not time the gathers cost the step" in text
    gpu = pd.Series(
        _gather_row(backend="nccl", wait=1.05, prof_all_gather_ms=29.84,
                    prof_all_gather_overlapped_ms=8.02, prof_all_gather_overlap_share=0.269,
                    prof_all_gather_waited_ms=0.0, prof_gpu_busy_ms=183.0, prof_step_ms=343.0,
                    **calls)
    )  # fmt: skip
    text = q33._gather_sentence(gpu, "FSDP (bf16 compute)")
    assert "exposed on the timeline is" not in text
    assert text.endswith("not time the step loses; the 0.00 ms compute waited for them is.")
    assert "All 21.82 ms they ran outside compute fell where the GPU had no compute kernel" in text
    layer = gpu.copy()
    layer[["prof_all_gather_ms", "prof_all_gather_overlapped_ms"]] = (226.0, 31.0)
    layer["prof_all_gather_waited_ms"] = 121.0
    assert q33._units_waits(gpu, layer) == (
        "with compute waiting 0.00 and 121 ms for the all-gathers (21.82 and 195 ms of "
        "all-gather outside compute on the timeline)"
    )


def test_a_wait_longer_than_the_gathers_is_not_quoted_as_their_own_time():
    """The CPU reference's short answer: the main thread waited 13.16 ms for gathers that take
    12.18 ms of the profiled step: the wait is said to exceed their time on the timeline, as it
    also counts time queued behind other collectives; a shorter wait is not marked."""
    import pandas as pd

    row = _gather_row(wait=13.16, prof_all_gather_ms=12.18, prof_step_ms=52.0)
    text = q33._short_run(pd.Series(row), "FSDP (fp32)")
    assert (
        "the main thread, which runs the compute, waited 13.16 ms for them, more than their "
        "12.18 ms on the timeline (the wait also counts time queued behind other collectives), "
        "so they do not finish in time."
    ) in text
    shorter = q33._short_run(pd.Series({**row, "gather_wait_ms_mean": 7.4}), "FSDP (fp32)")
    assert "waited 7.40 ms for them, so" in shorter and "more than their" not in shorter


def test_the_peers_wait_is_a_number_or_not_measured_never_a_dash():
    """The CPU reference: the peer has no wait measured, ours has the main thread's 10.35 ms;
    the sentence once read "compute waited – ms for them (ours – ms)"."""
    import pandas as pd

    def run(variant, wait):
        return {"variant": variant, "status": "ok", "backend": "gloo", "step_ms_mean": 38.3,
                "prof_all_gather_ms": 11.0, "prof_all_gather_overlap_share": 0.0,
                "gather_wait_ms_mean": wait}  # fmt: skip

    df = pd.DataFrame([run("fsdp_bf16", 10.35), run("torch_fsdp_bf16", float("nan"))])
    text = q33._peer_sentence(df)
    assert "the time compute waited for them: not measured (ours 10.35 ms)." in text
    assert "–" not in text


def test_a_counted_saving_off_the_formula_says_by_how_much_and_why():
    """The CPU reference: the tensors held save 13.77 MiB against the formula's 11.77 MiB; the
    2.00 MiB is the sharded optimizer's uneven split, not a match by construction."""
    df = _fsdp_rows()
    so = df["variant"] == "sharded_optimizer"
    df.loc[so, "optimizer_state_mb"] = 8 * 3_084_928 / 2 / 2**20 + 2.0
    df.loc[so, "held_mb"] = 2 * 11.77 + df.loc[so, "optimizer_state_mb"]
    fs = df["variant"] == "fsdp"
    _, _, _, saving = q33.expected_saving(df[fs].iloc[0])
    df.loc[fs, "held_mb"] = df.loc[so, "held_mb"].iloc[0] - saving - 2.0
    text = q33.q32(df, measured=False)
    assert f"a saving of **{saving + 2:.2f} MiB**, 2.00 MiB more than the formula's " in text
    assert "so its largest rank holds 2.00 MiB more optimizer state than the even split" in text
    assert "by construction" not in text and "not explained" not in text
    df.loc[fs, "held_mb"] += 2.0
    assert "(the count the formula makes, so it matches by construction)" in q33.q32(df, False)


def test_the_four_gpu_reference_answers_from_its_numbers(tmp_path):
    """The 4x H200 reference (units of a block and of a layer, DDP in bf16, world size 2): Q32
    compares the backward peaks and explains the gap with numbers that add up, Q33 sets the
    units side by side, every figure computed from the CSV."""
    import shutil

    import pandas as pd
    from pipeline_utils import ROOT

    shutil.copy(ROOT / "report" / "reference" / "h200-x4" / "csv" / "fsdp.csv", tmp_path)
    ctx = analysis.context(tmp_path)
    df = pd.read_csv(tmp_path / "fsdp.csv").set_index("variant")
    so, fs = df.loc["sharded_optimizer"], df.loc["fsdp"]
    got = so.mem_backward_peak_mb - fs.mem_backward_peak_mb
    assert f"a saving of **{got:,.0f} MiB**" in ctx["q32_details"]
    # the peak shows the parameter half less the gathered weights; the gradient half shows
    # before the optimizer step
    params = 4 * fs.sharded_params / 2 / 2**20
    expect = params - fs.gathered_peak_mb
    assert abs(got - expect) < 0.01 * got
    assert (
        f": {expect:,.0f} MiB, {abs(got - expect):.2f} MiB from the measured" in ctx["q32_details"]
    )
    done = so.mem_before_step_allocated_mb - fs.mem_before_step_allocated_mb
    assert f"{done:,.0f} MiB saved" in ctx["q32_details"]
    assert "unexplained" not in ctx["q32_details"]
    assert "MB" not in ctx["q32_details"].replace("MiB", "")
    calls = lambda r: int(  # noqa: E731
        r.all_gather_into_tensor_calls + r.reduce_scatter_tensor_calls + r.all_reduce_calls
    )
    text = (
        f"units of a block make {calls(df.loc['fsdp_bf16'])} collective calls a step against "
        f"{calls(df.loc['fsdp_bf16_layer'])} with a unit per layer"
    )
    assert text in ctx["q33_details"]
    assert "GPU busy in the profiled step" in ctx["time_table"]
    assert ctx["optimizer"] == "fused kernels"


def test_gathers_that_compute_never_waited_for_finish_in_time_and_compiling_is_compared():
    """A host-bound run's gathers overlap little compute, yet compute never waited for them:
    Q33 calls them in time and says where the rest fell; a run that waited is not in time; the
    compiled runs are set beside the eager ones."""
    import pandas as pd

    base = {"backend": "nccl", "status": "ok", "all_gather_into_tensor_mb": 200.0,
            "all_gather_into_tensor_calls": 66, "prof_step_ms": 200.0}  # fmt: skip
    rows = [
        {**base, "variant": "ddp_bf16", "step_ms_mean": 230.0, "fwd_ms_mean": 60.0,
         "prof_gpu_busy_ms": 120.0},
        {**base, "variant": "fsdp_bf16", "step_ms_mean": 225.0, "fwd_ms_mean": 86.0,
         "prof_gpu_busy_ms": 130.0, "prof_all_gather_ms": 32.0,
         "prof_all_gather_overlapped_ms": 8.0, "prof_all_gather_overlap_share": 0.25,
         "prof_all_gather_waited_ms": 0.5, "prof_all_gather_fwd_ms": 16.0,
         "prof_all_gather_fwd_overlap_share": 0.2, "prof_all_gather_fwd_waited_ms": 0.5},
        {**base, "variant": "ddp_bf16_compiled", "step_ms_mean": 150.0, "fwd_ms_mean": 33.0,
         "prof_gpu_busy_ms": 170.0},
        {**base, "variant": "fsdp_bf16_compiled", "step_ms_mean": 148.0, "fwd_ms_mean": 53.0,
         "prof_gpu_busy_ms": 160.0, "prof_all_gather_ms": 35.0,
         "prof_all_gather_overlapped_ms": 13.0, "prof_all_gather_overlap_share": 0.37,
         "prof_all_gather_waited_ms": 14.0},
    ]  # fmt: skip
    df = pd.DataFrame(rows)
    eager = q33._gather_sentence(df.iloc[1], "FSDP (bf16 compute)")
    assert "8.00 ms (25.0%) of it while compute ran; compute waited for them 0.50 ms" in eager
    assert "(1.6% of their time): they finish in time." in eager
    assert "GPU had no compute kernel to run" in eager
    compiled = q33._gather_sentence(df.iloc[3], "FSDP (bf16 compute, compiled blocks)")
    assert "compute waited for them 14.00 ms (40.0% of their time): they finish in time only" in (
        compiled
    )
    assert "GPU had no compute kernel" not in compiled
    # a GPU-bound run (busy 95% of its step) whose gathers compute never waited for: where
    # they did not overlap, no compute ran, and nothing says the host was the reason
    bound = df.iloc[3].copy()
    bound["prof_all_gather_waited_ms"], bound["prof_gpu_busy_ms"] = 0.5, 190.0
    text = q33._gather_sentence(bound, "FSDP")
    assert (
        "21.50 ms of the 22.00 ms they ran outside compute fell where no compute kernel ran" in text
    )
    assert "waited for the host" not in text
    # the forward's 26 ms over DDP's is not its 0.5 ms of waiting for gathers
    assert q33._forward_cost(df, "fsdp_bf16") == (
        " Its forward takes 86.00 ms a step against 60.00 ms for DDP (bf16 autocast), which "
        "gathers nothing; compute waited 0.50 ms for its forward gathers, so 25.50 ms of the "
        "26.00 ms difference is not waiting for gathers."
    )
    text = q33._compiled_sentence(df)
    assert "DDP's step from 230 to 150 ms (forward 60.00 → 33.00 ms" in text
    assert "FSDP's step from 225 to 148 ms" in text
    assert f"Compiled, FSDP takes {148 / 150:.2f}× the step of DDP." in text
    assert q33._compiled_sentence(df.iloc[:2]) == ""


def test_the_graphed_runs_are_set_beside_the_compiled_ones():
    """Q33 gives what replaying the compiled step as CUDA graphs changed (step, GPU busy,
    reserved memory) for DDP and FSDP, the graphed FSDP's gathers during compute by phase and
    its step against the graphed DDP step; nothing without the pairs."""
    import pandas as pd

    base = {"backend": "nccl", "status": "ok", "prof_step_ms": 100.0}
    rows = [
        {**base, "variant": "ddp_bf16_compiled", "step_ms_mean": 150.0, "prof_gpu_busy_ms": 90.0,
         "mem_reserved_mb": 60000.0},
        {**base, "variant": "fsdp_bf16_compiled", "step_ms_mean": 140.0,
         "prof_gpu_busy_ms": 80.0, "mem_reserved_mb": 40000.0},
        {**base, "variant": "ddp_bf16_graphed", "step_ms_mean": 120.0, "prof_gpu_busy_ms": 99.0,
         "mem_reserved_mb": 61000.0},
        {**base, "variant": "fsdp_bf16_graphed", "step_ms_mean": 126.0,
         "prof_gpu_busy_ms": 98.0, "mem_reserved_mb": 52000.0,
         "prof_all_gather_overlap_share": 0.93, "prof_all_gather_fwd_overlap_share": 0.91,
         "prof_all_gather_bwd_overlap_share": 0.95},
    ]  # fmt: skip
    df = pd.DataFrame(rows)
    text = q33._graphed_sentence(df)
    assert "DDP's step from 150 to 120 ms (GPU busy 90.0% → 99.0%" in text
    assert "memory reserved 60,000 → 61,000 MiB" in text
    assert "FSDP's step from 140 to 126 ms (GPU busy 80.0% → 98.0%" in text
    assert "all-gathers run 93.0% of their time during compute (forward 91.0%, backward 95.0%)" in (
        text
    )
    assert f"its step takes {126 / 120:.2f}× the graphed DDP step." in text
    assert q33._graphed_sentence(df.iloc[:2]) == ""


def test_the_peer_is_set_beside_our_fsdp_run_for_run():
    import pandas as pd

    def run(variant, step, share, waited):
        return {"variant": variant, "status": "ok", "backend": "nccl", "step_ms_mean": step,
                "prof_all_gather_ms": 30.0, "prof_all_gather_overlap_share": share,
                "prof_all_gather_waited_ms": waited}  # fmt: skip

    df = pd.DataFrame([run("fsdp_bf16", 150.0, 0.4, 0.5), run("torch_fsdp_bf16", 200.0, 0.6, 2.0)])
    text = q33._peer_sentence(df)
    assert (
        "PyTorch FSDP2 (bf16 compute) takes 200 ms a step against our 150 ms (0.75× its time); "
        "its all-gathers take 30.00 ms on the timeline, 60.0% of it during compute (ours "
        "40.0%); the time compute waited for them: 2.00 ms (ours 0.50 ms)."
    ) in text
    assert "compiled" not in text  # no compiled pair in these rows
    assert q33._peer_sentence(df.iloc[:1]) == ""


def test_exposed_forward_gathers_are_costed_against_the_same_precision_ddp_forward(tmp_path):
    """On an earlier 4x H200 reference (82f9c7d, before the gather waits were measured) FSDP
    bf16's forward gathers are 43.7% hidden, yet its forward is within 1.9 ms of DDP bf16's
    (which gathers nothing): Q33 says what the exposed time cost, not only that it was
    exposed."""
    import shutil

    import pandas as pd
    from pipeline_utils import ROOT

    shutil.copy(ROOT / "tests" / "fixtures" / "h200-x4-82f9c7d" / "fsdp.csv", tmp_path)
    ctx = analysis.context(tmp_path)
    df = pd.read_csv(tmp_path / "fsdp.csv").set_index("variant")
    r, d = df.loc["fsdp_bf16"], df.loc["ddp_bf16"]
    exposed = r.prof_all_gather_fwd_ms * (1 - r.prof_all_gather_fwd_overlap_share)
    extra = r.fwd_ms_mean - d.fwd_ms_mean
    assert extra < 0.5 * exposed
    assert (
        f"the {exposed:.2f} ms of forward gathers outside compute cost the forward at most "
        f"{extra:.2f} ms; the rest ran in time the compute stream had no kernel to run anyway"
    ) in ctx["q33_details"]


def test_a_slower_bf16_step_is_called_slower():
    """The CPU reference: bf16 compute made the FSDP step 115 -> 368 ms; the sentence once
    called that "0.31× faster"."""
    import pandas as pd

    df = pd.DataFrame(
        {
            "status": ["ok", "ok"],
            "backend": ["gloo", "gloo"],
            "variant": ["fsdp", "fsdp_bf16"],
            "step_ms_mean": [115.0, 368.0],
            "all_gather_into_tensor_mb": [18.65, 9.33],
        }
    )
    text = q33._precision_sentence(df)
    assert "goes from 115 to 368 ms (3.20× slower)" in text and "faster" not in text
    df["step_ms_mean"] = [368.0, 115.0]
    assert "(3.20× faster)" in q33._precision_sentence(df)


def test_q32_and_q33_answer_at_the_handouts_length_with_the_details_after(tmp_path):
    """The four-GPU reference: Q33 in 2-3 sentences (one per FSDP run with units of a block,
    each with its verdict), Q32 in 1-2; the long accounts are the details."""
    import re
    import shutil

    from pipeline_utils import ROOT

    shutil.copy(ROOT / "tests" / "fixtures" / "h200-x4-82f9c7d" / "fsdp.csv", tmp_path)
    ctx = analysis.context(tmp_path)
    sentences = [x for x in re.split(r"(?<=\.) (?=[A-Z])", ctx["q33"]) if x]
    assert 2 <= len(sentences) <= 3 and len(ctx["q33"]) < 600, ctx["q33"]
    assert sentences[0].startswith("FSDP (fp32): the weight all-gathers take 71.58 ms")
    assert sentences[0].endswith("so they finish in time: compute hides nearly all of their time.")
    assert "FSDP (bf16 compute)" in sentences[1] and "finish in time only in part" in sentences[1]
    assert len(ctx["q33_details"]) > 3 * len(ctx["q33"])
    assert ctx["q33_details"].startswith("FSDP (fp32): the all-gathers")
    assert len(re.split(r"(?<=\.) (?=[A-Z])", ctx["q32"])) <= 2 and "**12,996 MiB**" in ctx["q32"]
    assert "Optimizer-state sharding splits only" in ctx["q32_details"]


@pytest.mark.parametrize("runs", [1, 7, 13])
def test_the_fsdp_figures_labels_do_not_collide(tmp_path, monkeypatch, runs):
    """The four-GPU reference's runs (7), and as few or as many runs as a preset has (the gpu
    preset's 13 variants: the reference rows repeated under every label)."""
    import pandas as pd
    from figure_checks import drawn_figures
    from pipeline_utils import ROOT

    from cs336_systems.stages.fsdp import figures
    from cs336_systems.stages.fsdp.rows import LABELS

    df = pd.read_csv(ROOT / "tests" / "fixtures" / "h200-x4-82f9c7d" / "fsdp.csv")
    if runs != len(df):
        df = pd.concat([df] * 2, ignore_index=True).iloc[:runs].assign(variant=list(LABELS)[:runs])
    df.to_csv(tmp_path / "fsdp.csv", index=False)
    with drawn_figures(monkeypatch, figures) as caught:
        figures.draw(tmp_path, tmp_path / "figures")
    assert [p.name for p, _ in caught] == ["fsdp_memory.png", "fsdp_time.png"]
    assert all(hits == [] for _, hits in caught), caught
