"""A model of one's own through the FSDP stage (docs/own-model.md): `fsdp.size` naming it,
DDP, the sharded optimizer and our FSDP (units of its ModuleLists' children, or of each
Linear and Embedding) train it on two gloo ranks; the rows carry its name."""

from __future__ import annotations

import json
import os
import types

import pandas as pd
import pytest
import torch
import torch.distributed as dist
from dist_utils import run_forked_ranks
from pipeline_utils import block

from cs336_systems.planning import own_model as plan_own
from cs336_systems.stages.fsdp import measure as stage

NAME = "conv-lm"
OWN = {"name": NAME, "factory": "cs336_systems.models.examples:conv_lm"}
VARIANTS = ["ddp", "sharded_optimizer", "fsdp", "fsdp_layer", "torch_fsdp_bf16"]


def _args():
    knobs = block("fsdp", size=NAME, context_length=8, batch_per_rank=1, warmup_steps=0,
                  measure_steps=1, profile=False, variants=VARIANTS)  # fmt: skip
    return stage.parse_args(["--machine", "m", "--preset", "cpu", "--out", "x.csv", *knobs])


def _worker(rank: int, store_path: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    torch.set_num_threads(1)
    args = _args()
    ctx = types.SimpleNamespace(rank=rank, world_size=2, device=torch.device("cpu"))
    rows = {v: stage.measure_variant(v, args, ctx) for v in VARIANTS}
    torch.save(rows, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def rank0():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(plan_own.ENV, json.dumps(OWN))
        return run_forked_ranks(_worker, 2)[0]


def test_our_fsdp_shards_an_own_model(rank0):
    rows = rank0
    for v, row in rows.items():
        assert row["step_ms_mean"] > 0, v
    fsdp, ddp = rows["fsdp"], rows["ddp"]
    assert fsdp["fsdp_units"] == "block" and rows["fsdp_layer"]["fsdp_units"] == "layer"
    assert fsdp["sharded_params"] > 0 and fsdp["held_mb"] < ddp["held_mb"]
    assert rows["sharded_optimizer"]["held_mb"] < ddp["held_mb"]


def test_the_rows_carry_the_own_models_name(monkeypatch, tmp_path):
    monkeypatch.setenv(plan_own.ENV, json.dumps(OWN))
    args = _args()
    args.block = type(args.block)(**{**vars(args.block), "backend": "nccl"})
    rows = stage.run(args, ["fsdp"])  # no GPUs here: skipped rows, the model's columns
    assert {r["size"] for r in rows} == {NAME}
    assert {r["own_model"] for r in rows} == {OWN["factory"]}
    assert all(r["status"].startswith("skipped") for r in rows)


def test_the_section_renders_the_own_models_rows(rank0, monkeypatch, tmp_path):
    from cs336_systems.core.results import provenance, write_csv
    from cs336_systems.reporting.report import render
    from cs336_systems.stages.fsdp import analysis

    monkeypatch.setenv(plan_own.ENV, json.dumps(OWN))
    args = _args()
    args.block = type(args.block)(**{**vars(args.block), "backend": "nccl"})
    columns = {k: v for k, v in stage.run(args, ["fsdp"])[0].items() if k != "status"}
    rows = [{**provenance("m", "cpu"), **columns, **r, "variant": v, "status": "ok"}
            for v, r in rank0.items()]  # fmt: skip
    write_csv(pd.DataFrame(rows), tmp_path / "fsdp.csv")
    analysis.plot(tmp_path, tmp_path / "figures")
    analysis.context(tmp_path)
    text = render(tmp_path, ["fsdp"])
    assert f"own model **{NAME}**" in text and "FLOPs counted" in text
