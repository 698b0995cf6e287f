"""Points no kernel can run (SDPA's flash and cuDNN backends in fp32 on CUDA) are planned as
`skipped` rows with the reason, never attempted, and cost nothing in the stage's estimate."""

from __future__ import annotations

import pytest
import torch

from cs336_systems import budget
from cs336_systems.budget.model import CostModel
from cs336_systems.stages.flash import jobs as flash_jobs
from cs336_systems.stages.flash import measure as flash_measure
from cs336_systems.stages.flash import plan as flash_plan

CUDA = torch.device("cuda")  # only named: a skipped point touches no device


def job(impls: list[str], dtype: str) -> flash_jobs.Job:
    return flash_jobs.Job(
        grid="sweep", impls=impls, dtype=dtype, batch_size=1, heads=1, head_dims=[16],
        seq_lens=[128, 256], max_seq_len={}, flash_tiles=(16, 16),
    )  # fmt: skip


def test_sdpa_backends_without_an_fp32_kernel_are_skipped_rows_not_attempts(monkeypatch):
    def attempted(*args, **kwargs):
        raise AssertionError("a point without a kernel was attempted")

    monkeypatch.setattr(flash_measure, "measure", attempted)
    timer = flash_jobs.Timer(CUDA, 1.0, 1.0, 0, 1)
    rows = flash_measure.run(job(["sdpa_cudnn", "sdpa_flash"], "fp32"), CUDA, timer, None, {})
    assert [(r["impl"], r["seq_len"]) for r in rows] == [
        ("sdpa_cudnn", 128), ("sdpa_flash", 128), ("sdpa_cudnn", 256), ("sdpa_flash", 256),
    ]  # fmt: skip
    assert {r["status"] for r in rows if r["impl"] == "sdpa_cudnn"} == {
        "skipped: SDPA's cudnn backend has no fp32 kernel (only fp16, bf16)"
    }
    flash = [r["status"] for r in rows if r["impl"] == "sdpa_flash"]
    assert all(s.startswith("skipped: SDPA's flash backend has no fp32") for s in flash)


@pytest.mark.parametrize(
    ("impl", "dtype", "device", "skipped"),
    [
        ("sdpa_cudnn", "fp32", "cuda", True),
        ("sdpa_cudnn", "bf16", "cuda", False),
        ("sdpa_cudnn", "fp16", "cuda", False),
        ("sdpa_flash", "fp32", "cuda", True),
        ("sdpa_efficient", "fp32", "cuda", False),  # the memory-efficient backend takes fp32
        ("flash_triton", "fp32", "cuda", False),
        ("sdpa_flash", "fp32", "cpu", False),  # the CPU's own SDPA flash kernel takes fp32
    ],
)
def test_the_rule_follows_each_backends_dtypes(impl, dtype, device, skipped):
    why = flash_jobs.skip_reason(impl, 128, dtype, torch.device(device), {}, None)
    assert why.startswith("skipped:") if skipped else why == ""


def test_a_point_without_a_kernel_costs_nothing_in_the_estimate():
    """The gpu preset's sweep with SDPA's cuDNN added: its fp32 points are no seconds, its
    bf16 ones some."""
    k = flash_plan.KNOBS.from_block(budget.run_config()["flash"]["gpu"])
    cost = CostModel(budget.H100)
    assert flash_plan._sweep_point_s(k, cost, "sdpa_cudnn", "fp32", 64, 4096) == 0.0
    assert flash_plan._sweep_point_s(k, cost, "sdpa_cudnn", "bf16", 64, 4096) > 0.0
    assert flash_plan._sweep_point_s(k, cost, "sdpa_efficient", "fp32", 64, 4096) > 0.0
