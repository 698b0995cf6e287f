"""HolisticTraceAnalysis's numbers beside ours: the table, the sentence where they differ and
why, and the reason there is no table, on small per-rank traces (times in microseconds)."""

from __future__ import annotations

import pandas as pd
from trace_utils import write_trace

from cs336_systems.reporting import hta_check
from cs336_systems.reporting.hta_check import cache_path, cross_check

GEMM = "sm90_xmma_gemm_bf16bf16"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def _run(raw, name="ddp_overlap"):
    """Rank 0: a barrier's all-reduce (30 us) before the step, then an all-reduce half under a
    gemm (ours: 50% overlapped; HTA, counting the barrier, 100 of 230 us); rank 1 alike
    without the barrier."""
    step = [(GEMM, 110, 200, 7), (NCCL, 210, 200, 20)]
    write_trace(raw / name / "rank0.json.gz", 0, [(NCCL, 50, 30, 20), *step], step=(100, 400))
    write_trace(raw / name / "rank1.json.gz", 1, step, step=(100, 400))


def _row(name="ddp_overlap", **cols):
    ours = dict(prof_overlap_share=0.5, prof_comm_kernel_ms=0.2, prof_comm_exposed_ms=0.1,
                prof_gpu_busy_ms=0.3, prof_gpu_idle_ms=0.1, prof_step_ms=0.4)  # fmt: skip
    return pd.DataFrame([{"variant": "overlap", "trace": name, **ours, **cols}])


def test_the_table_sets_hta_beside_ours_and_says_why_they_differ(tmp_path):
    tmp_path = tmp_path / "raw"
    _run(tmp_path)
    ctx = cross_check(tmp_path, _row())
    table = ctx["hta_table"]
    assert ctx["hta_empty"] == ""
    overlap = [line for line in table.splitlines() if "NCCL time during compute" in line]
    assert len(overlap) == 2  # one per rank
    assert "| 50.0%" in overlap[0] and "43.5%" in overlap[0] and "-6.5 pt" in overlap[0]
    assert "| –" in overlap[1] and "50.0%" in overlap[1]  # ours: rank 0's only
    why = next(line for line in ctx["hta_lines"] if "NCCL time during compute" in line)
    assert why.startswith("ddp_overlap, rank 0, NCCL time during compute: HTA 43.5%, ours 50.0%")
    assert "1 of them before the step's range (0.030 ms of them NCCL)" in why
    assert why.endswith("with ours' it reads 50.0%.")
    # a number within a tenth of ours gets no sentence
    assert not any(", compute (ms):" in line for line in ctx["hta_lines"])
    assert "| compute (ms)" in table and "| +0.00 ms (+0%)" in table


def test_a_difference_no_definition_explains_says_so(tmp_path):
    tmp_path = tmp_path / "raw"
    _run(tmp_path)
    ctx = cross_check(tmp_path, _row(prof_overlap_share=0.9))
    why = next(line for line in ctx["hta_lines"] if "NCCL time during compute" in line)
    assert "With all of ours' definitions HTA's method reads 50.0%, still more than 10% off" in why


def test_without_gpu_kernels_or_traces_the_reason_is_given(tmp_path):
    tmp_path = tmp_path / "raw"
    gloo = [("gloo:all_reduce", 5, 10), ("aten::mm", 0, 20)]
    for rank in (0, 1):
        write_trace(tmp_path / "fsdp_fsdp" / f"rank{rank}.json.gz", rank, [], host=gloo)
    ctx = cross_check(tmp_path, _row("fsdp_fsdp"))
    assert ctx["hta_table"] == "" and ctx["hta_lines"] == []
    assert ctx["hta_empty"].startswith("The 2 traces of fsdp_fsdp hold no GPU kernels: 4 host")
    assert "2 of them gloo's collectives on worker threads (a CPU run)" in ctx["hta_empty"]
    assert "No profiled step kept" in cross_check(tmp_path, _row(""))["hta_empty"]
    assert "are not in" in cross_check(tmp_path, _row("ddp_naive"))["hta_empty"]


def test_the_result_is_kept_and_read_back_until_a_row_or_a_trace_changes(tmp_path, monkeypatch):
    """The plots job reads the traces once and keeps the result beside raw/; the report reads
    it back without opening a trace, and computes again when a row or a trace changed."""
    raw = tmp_path / "ddp" / "raw"
    _run(raw)
    first = cross_check(raw, _row())  # the report: reads, writes nothing
    assert not cache_path(raw).exists()
    assert cross_check(raw, _row(), keep=True) == first  # the plots job keeps it
    assert cache_path(raw) == tmp_path / "ddp" / "hta.json" and cache_path(raw).is_file()
    computed = []
    real = hta_check._cross_check
    monkeypatch.setattr(hta_check, "_cross_check", lambda *a: computed.append(1) or real(*a))
    assert cross_check(raw, _row()) == first and computed == []
    # another number of ours: computed again
    assert cross_check(raw, _row(prof_overlap_share=0.9)) != first and computed == [1]
    # a trace written again (another run): computed again
    write_trace(raw / "ddp_overlap" / "rank1.json.gz", 1, [(GEMM, 110, 250, 7)], step=(100, 400))
    again = cross_check(raw, _row(prof_overlap_share=0.9), keep=True)
    assert computed == [1, 1] and again != first
    assert cross_check(raw, _row(prof_overlap_share=0.9)) == again and computed == [1, 1]
    # a cache that cannot be read is computed again, not trusted
    cache_path(raw).write_text("{not json")
    assert cross_check(raw, _row(prof_overlap_share=0.9)) == again and len(computed) == 3


def test_the_kept_result_depends_on_every_number_the_table_shows(tmp_path):
    """Each of ours that the table sets beside HTA's changes the cache's key, those the
    compute measure derives included; a column the table does not read leaves it."""
    raw = tmp_path / "raw"
    _run(raw)
    base = hta_check._key(raw, _row())
    shown = {m: hta_check.ours(_row().iloc[0], m) for m, _, _ in hta_check.MEASURES}
    for column in _row().columns.drop(["variant", "trace"]):
        changed = _row(**{column: 7.0})
        assert hta_check._key(raw, changed) != base, column
        moved = {m: hta_check.ours(changed.iloc[0], m) for m in shown}
        assert moved != shown, column  # the table reads it
    assert hta_check._key(raw, _row(variant="naive")) == base
