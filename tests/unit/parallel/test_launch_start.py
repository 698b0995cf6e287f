"""A distributed stage's launching process starts its workers before it imports torch: the
workers import it themselves, and on a GPU host the import takes seconds of cards already held.
Each stage runs in a fresh interpreter with two claimed cards, its launch faked to say whether
torch was imported by then (and to end the process), and its provenance (which imports torch in
a thread beside the launch: core/results.py's `provenance_meanwhile`) left out."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pipeline_utils import ROOT, block

SCRIPT = """
import json, os, sys
os.environ["CS336_GPU_CLAIMED"] = "0,1"  # two cards claimed for the job
from cs336_systems.core import results
from cs336_systems.parallel import launch
import importlib

results.provenance_meanwhile = lambda *a, **k: dict

def fake_launch(module, argv, topology, **kw):
    seen = {"world": topology.world_size, "torch": "torch" in sys.modules}
    print("SEEN" + json.dumps(seen), flush=True)
    os._exit(0)  # what follows the launch may import torch

launch.launch = fake_launch
stage, argv = sys.argv[1], json.loads(sys.argv[2])
importlib.import_module(f"cs336_systems.stages.{stage}.measure").main(argv)
"""

RUN = ["--machine", "m", "--preset", "gpu"]


@pytest.mark.parametrize(
    "stage,argv",
    [
        ("allreduce", ["--backend", "nccl", *block("allreduce", "gpu", world_sizes=[2])]),
        ("ddp", ["variants", *block("ddp", "gpu")]),
        ("ddp", ["sharding", *block("ddp", "gpu")]),
        ("fsdp", block("fsdp", "gpu")),
        ("leaderboard", ["--plans", "full", *block("leaderboard", "gpu")]),
    ],
)
def test_a_distributed_stage_launches_before_it_imports_torch(tmp_path, stage, argv):
    argv = [*argv, *RUN, "--out", str(tmp_path / "rows.csv")]
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, stage, json.dumps(argv)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0 and "SEEN" in out.stdout, out.stderr[-3000:]  # it launched
    seen = json.loads(out.stdout.split("SEEN", 1)[1])
    assert seen == {"world": 2, "torch": False}
