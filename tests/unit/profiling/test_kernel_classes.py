"""Kernel classification by name, on real kernel names."""

from __future__ import annotations

import csv

import pytest
from pipeline_utils import ROOT

from cs336_systems.profiling.kernel_classes import (
    KERNEL_CLASSES,
    classify_kernel,
    kernel_operation,
    short_kernel_name,
)
from cs336_systems.profiling.nsys import read_stats_csv

FIXTURES = ROOT / "tests" / "fixtures"
PROVISIONAL = FIXTURES / "provisional" / "kernel_names.csv"
# written by scripts/gpu_capture_fixtures.py on a GPU host (absent until then)
CAPTURED_KERN_SUM = FIXTURES / "gpu" / "nsys_cuda_gpu_kern_sum.csv"


def _labelled() -> list[tuple[str, str]]:
    with open(PROVISIONAL) as f:
        return [(r["name"], r["expected_class"]) for r in csv.DictReader(f)]


@pytest.mark.parametrize(("name", "expected"), _labelled(), ids=lambda x: str(x)[:40])
def test_known_names_get_their_class(name, expected):
    assert classify_kernel(name) == expected


def test_every_class_is_exercised_and_known():
    labels = {expected for _, expected in _labelled()}
    assert labels == set(KERNEL_CLASSES)
    assert classify_kernel("some_kernel_nobody_knows") == "other"


def test_short_names():
    softmax = (
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)"
    )
    assert short_kernel_name(softmax) == "at::native::cunn_SoftMaxForward<…>"
    cutlass = "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>(X::Params)"
    assert (
        short_kernel_name(cutlass) == "cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>"
    )
    assert short_kernel_name("ampere_sgemm_128x64_tn") == "ampere_sgemm_128x64_tn"
    assert len(short_kernel_name("x" * 500, limit=40)) == 40


# the loss's log-softmax and attention's softmax, as the cpu and h200-x4 references name them
_NS = "void at::native::<unnamed>::"
LOG_SOFTMAX = [
    "aten::_log_softmax",
    "aten::log_softmax",
    "aten::_log_softmax_backward_data",
    "LogSoftmaxBackward0",
    "autograd::engine::evaluate_function: LogSoftmaxBackward0",
    f"{_NS}cunn_SoftMaxForwardSmem<(int)4, float, float, float, "
    f"at::native::<unnamed>::LogSoftMaxForwardEpilogue, long>(T4 *, const T2 *, T6)",
    f"{_NS}cunn_SoftMaxBackwardSmem<(int)4, float, float, float, "
    f"at::native::<unnamed>::LogSoftMaxBackwardEpilogue>(T2 *, const T4 *, const T4 *, long)",
]
SOFTMAX = [
    "aten::_softmax",
    "aten::softmax",
    "aten::_softmax_backward_data",
    "SoftmaxBackward0",
    "void <unnamed>::softmax_warp_forward<float, float, float, (int)10, (bool)0, (bool)0>"
    "(T2 *, const T1 *, int, int, int, const bool *, int, bool)",
    f"{_NS}cunn_SoftMaxForwardReg<float, float, float, "
    f"at::native::<unnamed>::SoftMaxForwardEpilogue, long, (int)4>(T3 *, const T1 *, T5)",
    f"{_NS}cunn_SoftMaxBackwardSmem<(int)4, float, float, float, "
    f"at::native::<unnamed>::SoftMaxBackwardEpilogue>(T2 *, const T4 *, const T4 *, long)",
]


@pytest.mark.parametrize("name", LOG_SOFTMAX, ids=lambda x: x[:50])
def test_log_softmax_is_the_loss_not_softmax(name):
    """The loss's log-softmax over the vocabulary is cross-entropy work: counted as `softmax`
    it made the cpu reference's Q7 and Q9 quote the loss as attention's softmax."""
    assert kernel_operation(name) == "cross-entropy"


@pytest.mark.parametrize("name", SOFTMAX, ids=lambda x: x[:50])
def test_attention_softmax_stays_softmax(name):
    assert kernel_operation(name) == "softmax"


@pytest.mark.skipif(not CAPTURED_KERN_SUM.exists(), reason="no captured nsys fixture yet")
def test_captured_kernel_names_are_classified():
    """On a real capture of a training step: GEMMs are found, few kernels are `other`, and
    names that say what they are land in that class."""
    df = read_stats_csv(CAPTURED_KERN_SUM)
    assert len(df) > 5
    classes = df["name"].map(classify_kernel)
    assert (classes == "gemm").any()
    assert (classes == "reduction").any()
    assert (classes == "elementwise").any()
    other_share = df.loc[classes == "other", "total_ns"].sum() / df["total_ns"].sum()
    assert other_share < 0.2, df.loc[classes == "other", "name"].tolist()
    for name, cls in zip(df["name"], classes, strict=True):
        low = name.lower()
        if "gemm" in low or "nvjet" in low:
            assert cls in ("gemm", "attention"), name
        if "softmax" in low:
            assert cls == "reduction", name
