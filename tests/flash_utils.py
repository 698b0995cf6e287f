"""The flash stage's sweep job as the stage tests run it, and a synthetic kernel test file (one
passing, one failing, one skipped test per kernel) for the kernel_tests stage."""

from __future__ import annotations

import json
import textwrap

from pipeline_utils import block

from cs336_systems.stages.flash import plan as flash_plan

COMMON = ["--machine", "test-machine", "--preset", "cpu"]


def flash_sweep(out, impls, seq_lens, *extra, steps=1, **changes) -> list[str]:
    """The flash stage's fp32 sweep job: the cpu preset's part of the block at head dim 16, no
    warm-up and `steps` timed steps, with `changes`."""
    timing = {**json.loads(block("flash")[1])["timing"], "warmup_steps": 0, "steps": steps}
    knobs = block("flash", part=flash_plan.SWEEP_KNOBS, impls=impls, head_dims=[16],
                  seq_lens=seq_lens, timing=timing, **changes)  # fmt: skip
    return ["sweep", *COMMON, "--dtype", "fp32", *knobs, "--out", str(out), *extra]


SYNTHETIC_TESTS = textwrap.dedent(
    """
    import pytest

    def test_pytorch_ok():
        assert True

    def test_triton_ok():
        assert True

    def test_triton_broken():
        assert 1 == 2, "wrong answer"

    @pytest.mark.skip(reason="not here")
    def test_triton_skipped():
        pass

    def test_unrelated():
        pass
    """
)
