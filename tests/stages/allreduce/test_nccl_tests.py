"""The all-reduce rows in nccl-tests' layout (stages/allreduce/nccl_tests.py), written beside the
job's CSV and read back."""

from __future__ import annotations

import pytest
from pipeline_utils import block

from cs336_systems.stages.allreduce import measure as ar
from cs336_systems.stages.allreduce import nccl_tests


def point(n: int, mb: float, ms: float, status: str = "ok") -> dict:
    return {"backend": "nccl", "buffers": "default", "world_size": n, "size_mb": mb,
            "bytes": int(mb * 2**20), "time_ms_median": ms, "status": status}  # fmt: skip


ROWS = [
    point(2, 1.0, 0.042326933145523),  # a 2-GPU run's row: algbw 24.77 GB/s
    point(4, 1.0, 0.05),
    point(4, 1024.0, 2.5),
    point(4, 4096.0, float("nan"), "oom"),
]


def test_the_columns_are_computed_and_read_back():
    text = nccl_tests.table(ROWS)
    lines = text.splitlines()
    assert lines[0].startswith("# all_reduce, nccl, default buffers, 2 ranks")
    data = [t for t in lines if not t.startswith("#")]
    assert len({len(t) for t in data}) == 1  # right-aligned to nccl-tests' widths
    parsed = nccl_tests.parse(text)
    assert [p["size"] for p in parsed] == ["1048576", "1048576", "1073741824"]
    assert [p["count"] for p in parsed] == ["262144", "262144", "268435456"]
    assert {(p["type"], p["redop"], p["root"], p["#wrong"]) for p in parsed} == {
        ("float", "sum", "-1", "0")
    }
    assert float(parsed[0]["time"]) == pytest.approx(42.33, abs=0.01)
    assert float(parsed[0]["algbw"]) == pytest.approx(24.77, abs=0.01)
    assert parsed[0]["busbw"] == parsed[0]["algbw"]  # n = 2: factor 1
    for p, r in zip(parsed[1:], ROWS[1:3], strict=True):
        algbw = r["bytes"] / (r["time_ms_median"] * 1e-3) / 1e9
        assert float(p["algbw"]) == pytest.approx(algbw, abs=0.006)
        assert float(p["busbw"]) == pytest.approx(algbw * 2 * 3 / 4, abs=0.006)
    assert "# 4294967296 B: oom" in lines
    assert "# Avg bus bandwidth" in text and "#wrong" in lines[2]


def test_the_stage_writes_the_file_beside_its_csv(tmp_path, monkeypatch):
    monkeypatch.setattr(
        ar, "run_world_size", lambda args, n: [r for r in ROWS if r["world_size"] == n]
    )
    out = tmp_path / "nccl.csv"
    knobs = block("allreduce", world_sizes=[2, 4])
    ar.main(["--backend", "nccl", "--machine", "m", "--preset", "gpu", *knobs, "--out", str(out)])
    text = nccl_tests.path_beside(out)
    assert text.name == "nccl.nccl-tests.txt" and out.exists()
    assert len(nccl_tests.parse(text.read_text())) == 3
