"""The leaderboard breakdown's classes: the loss's log-softmax is never attention's softmax."""

from __future__ import annotations

import pytest

from cs336_systems.engine.leaderboard_rules import classify

# names as torch.profiler gives them: the autograd node of a log-softmax's backward (the path
# of the operators around it on the host), and the CUDA kernels of F.log_softmax (a kernel with
# no linked operator, as a CUDA graph replays it, has a path of its name alone)
LOG_SOFTMAX = [
    "autograd::engine::evaluate_function: LogSoftmaxBackward0 / LogSoftmaxBackward0",
    "LogSoftmaxBackward0",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForwardSmem<4, float, float, float, "
    "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)",
    "void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, float, float, float, "
    "at::native::(anonymous namespace)::LogSoftMaxBackwardEpilogue>(float*, float const*, "
    "float const*, long)",
    "aten::cross_entropy_loss / aten::log_softmax / aten::_log_softmax",
    "triton_red_fused__log_softmax_0",
]


@pytest.mark.parametrize("name", LOG_SOFTMAX)
def test_a_log_softmax_is_the_loss(name):
    assert classify(name) == "loss"


@pytest.mark.parametrize(
    "name",
    [
        "aten::_softmax",
        "void at::native::(anonymous namespace)::cunn_SoftMaxForwardSmem<4, float, float, float, "
        "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
    ],
)
def test_a_plain_softmax_stays_attention(name):
    assert classify(name) == "attention"
