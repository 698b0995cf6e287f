"""HolisticTraceAnalysis's temporal breakdown and overlap, with its definitions, on small
per-rank traces whose answers are known (times in microseconds)."""

from __future__ import annotations

import math

import pytest
from trace_utils import write_trace

from cs336_systems.profiling.trace_breakdown import (
    SWITCHES,
    breakdown,
    evidence,
    hta_class,
    merge,
    read_folder,
)

GEMM = "sm90_xmma_gemm_bf16bf16"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def _rank0(folder):
    """A barrier's all-reduce before the step; in the step a gemm, an all-reduce half under
    it, a copy and one more gemm: 0.5 of the step's NCCL time under compute, 100/230 of the
    trace's."""
    kernels = [
        (NCCL, 50, 30, 20),  # before the step's range (100..500)
        (GEMM, 110, 200, 7),
        (NCCL, 210, 200, 20),
        ("Memcpy DtoD (Device -> Device)", 420, 20, 7),
        (GEMM, 450, 30, 7),
    ]
    return write_trace(folder / "rank0.json.gz", 0, kernels, step=(100, 400))


def test_hta_definitions_on_a_trace_with_known_overlap(tmp_path):
    _rank0(tmp_path)
    write_trace(tmp_path / "rank1.json.gz", 1, [(GEMM, 0, 100, 7), (NCCL, 20, 50, 20)])
    ranks = read_folder(tmp_path)
    assert sorted(ranks) == [0, 1] and ranks[0].step == (100, 500)
    hta = breakdown(ranks[0])
    assert hta["overlap"] == pytest.approx(100 / 230)
    assert hta["comm_ms"] == pytest.approx(0.230)
    assert hta["compute_ms"] == pytest.approx(0.230)  # the gemms; the copy is memory
    assert hta["communication_ms"] == pytest.approx(0.130)  # 50..80, 310..410
    assert hta["memory_ms"] == pytest.approx(0.020)
    assert hta["window_ms"] == pytest.approx(0.430)  # 50..480
    assert hta["idle_ms"] == pytest.approx(0.430 - 0.230 - 0.130 - 0.020)
    assert breakdown(ranks[1])["overlap"] == 1.0  # its all-reduce wholly under its gemm


def test_each_switch_turns_one_definition_into_ours(tmp_path):
    t = read_folder(_rank0(tmp_path).parent)[0]
    step = breakdown(t, SWITCHES[:1])
    assert step["overlap"] == pytest.approx(0.5) and step["window_ms"] == pytest.approx(0.370)
    ours = breakdown(t, SWITCHES)  # the copy as compute, the window from the step's start
    assert ours["compute_ms"] == pytest.approx(0.250) and ours["memory_ms"] == pytest.approx(0)
    assert ours["window_ms"] == pytest.approx(0.400) and ours["idle_ms"] == pytest.approx(0.050)
    e = evidence(t)
    assert (e["before_n"], e["apart_n"]) == (1, 1)
    assert e["before_comm_ms"] == pytest.approx(0.030) and e["lead_ms"] == pytest.approx(0.010)


def test_hta_rounds_each_kernel_inward_to_whole_microseconds(tmp_path):
    """10.5..12.4 becomes 11..12: HTA's parser rounds the start up and the end down."""
    write_trace(tmp_path / "r.json.gz", 0, [(GEMM, 10.5, 1.9, 7), (NCCL, 10.2, 3.0, 20)])
    t = read_folder(tmp_path)[0]
    assert breakdown(t)["compute_ms"] == pytest.approx(0.001)
    assert breakdown(t)["overlap"] == pytest.approx(1 / 2)  # 11..12 of 11..13
    exact = breakdown(t, ("exact",))
    assert exact["compute_ms"] == pytest.approx(0.0019) and exact["overlap"] == pytest.approx(
        1.9 / 3
    )


def test_kernel_classes_and_merging_follow_hta():
    assert (
        hta_class(NCCL) == "communication" and hta_class("ncclKernel_AllGather_RING") != "compute"
    )
    assert hta_class("Memset (Device)") == "memory" and hta_class("cudaStreamSync") == "other"
    assert hta_class("void at::native::vectorized_elementwise_kernel") == "compute"
    assert merge([(5, 9), (0, 4), (4, 6), (10, 11)]) == [(0, 9), (10, 11)]


def test_a_trace_without_gpu_events_gives_no_numbers(tmp_path):
    host = [("gloo:all_reduce", 5, 10), ("aten::mm", 0, 20)]
    write_trace(tmp_path / "r.json.gz", 3, [], step=(0, 30), host=host)
    t = read_folder(tmp_path)[3]
    assert not t.kernels and t.gloo_events == 1 and t.host_events == 3  # and the step's range
    assert all(math.isnan(v) for v in breakdown(t).values())
