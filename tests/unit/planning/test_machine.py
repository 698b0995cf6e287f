"""The machine tag and the GPUs the workflow sees without torch (planning/machine.py), and that
they agree with what torch sees (core/results.py:machine_tag)."""

from __future__ import annotations

import os
import stat

import pytest

from cs336_systems.planning import machine
from cs336_systems.planning.machine import Gpu, tag_for, visible

H100 = "NVIDIA H100 80GB HBM3"
GPUS = [Gpu(H100, "GPU-aaaa-1111", 81559.0), Gpu("NVIDIA H200", "GPU-bbbb-2222", 143771.0)]


def test_tag_names_the_first_gpu_and_counts_them():
    assert tag_for([]) == "cpu"
    assert tag_for([H100]) == "h100-80gb-hbm3"
    assert tag_for([H100, H100]) == "h100-80gb-hbm3-x2"
    long = tag_for(["NVIDIA " + "Quite A Long Name " * 8] * 3)
    assert len(long) <= machine.MAX_TAG_LENGTH and long.endswith("-x3")
    assert machine.check_tag(long) is None


@pytest.mark.parametrize(
    "env,expected",
    [
        (None, [H100, "NVIDIA H200"]),
        ("1", ["NVIDIA H200"]),
        ("1,0", ["NVIDIA H200", H100]),
        ("0,7,1", [H100]),  # CUDA stops at the first entry that names no device
        ("0,0", [H100]),
        ("7", []),
        ("GPU-bbbb", ["NVIDIA H200"]),  # a UUID prefix
        ("GPU-", []),  # ambiguous
        ("MIG-1234", [H100]),  # a MIG instance: its parent's model
    ],
)
def test_cuda_visible_devices_filters_like_cuda(env, expected):
    assert [g.name for g in visible(GPUS, env)] == expected


@pytest.mark.parametrize("env", ["", " ", "-1", "-1,0"])
def test_hidden_gpus_need_no_nvidia_smi(monkeypatch, env):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    monkeypatch.setattr(machine, "_installed", lambda: pytest.fail("looked for GPUs"))
    assert machine.visible_gpus() == [] and machine.machine_tag() == "cpu"


def fake_nvidia_smi(folder, lines: list[str]) -> None:
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\ncat <<'EOF'\n" + "\n".join(lines) + "\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_gpus_from_nvidia_smi(monkeypatch, tmp_path):
    fake_nvidia_smi(
        tmp_path,
        [f"{H100}, 81559, GPU-aaaa-1111", f"{H100}, 81559, GPU-cccc-3333"],
    )
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    machine._installed.cache_clear()
    try:
        assert machine.visible_gpus() == [
            Gpu(H100, "GPU-aaaa-1111", 81559.0),
            Gpu(H100, "GPU-cccc-3333", 81559.0),
        ]
        assert machine.machine_tag() == "h100-80gb-hbm3-x2"
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-cccc")
        assert machine.machine_tag() == "h100-80gb-hbm3"
    finally:
        machine._installed.cache_clear()


def test_gpus_from_the_driver_when_nvidia_smi_is_missing(tmp_path):
    for bus, (name, uuid) in {"0000:1b:00.0": (H100, "GPU-x"), "0000:a1:00.0": ("B", "")}.items():
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(
            f"Model: \t\t {name}\nIRQ:   \t\t 17\nGPU UUID: \t {uuid}\nBus Location: \t {bus}\n"
        )
    assert machine._from_proc(tmp_path) == [Gpu(H100, "GPU-x"), Gpu("B", "")]
    assert machine._from_proc(tmp_path / "missing") == []


def test_host_memory_is_known_here():
    total, free = machine.host_memory_mib(), machine.host_memory_mib("MemAvailable")
    assert total and free and 0 < free <= total


def test_torch_and_the_workflow_name_this_machine_alike():
    """Without torch (nvidia-smi, the driver, CUDA_VISIBLE_DEVICES) the workflow finds the tag
    torch would give: on CI both say `cpu`; on a GPU machine the GPU model."""
    from cs336_systems.core.results import machine_tag

    machine._installed.cache_clear()
    assert machine.machine_tag() == machine_tag()


@pytest.mark.gpu
def test_gpu_names_match_torch():
    import torch

    machine._installed.cache_clear()
    found = machine.visible_gpus()
    assert [g.name for g in found] == [
        torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
    ]
    total = torch.cuda.get_device_properties(0).total_memory / 2**20
    assert found[0].memory_mib == pytest.approx(total, rel=0.05)
