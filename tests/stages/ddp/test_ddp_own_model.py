"""A model of one's own through the DDP stage (docs/own-model.md): `ddp.size` naming it, each
of our DDP variants and the sharded optimizer train it on two gloo ranks, the replicas kept
equal, and the rows carry its name."""

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

from cs336_systems.core.workload import rank_batch
from cs336_systems.planning import own_model as plan_own
from cs336_systems.stages.ddp import measure as bench

NAME = "hf-tiny"
OWN = {"name": NAME, "factory": "cs336_systems.models.hf:gpt2_tiny"}
VARIANTS = [("naive", None), ("flat", None), ("overlap", None), ("bucketed", 1.0)]


def _args():
    knobs = block("ddp", size=NAME, context_length=8, batch_per_rank=1, warmup_steps=0,
                  measure_steps=1)  # fmt: skip
    run = ["variants", "--machine", "m", "--preset", "cpu", "--out", "x.csv"]
    return bench.parse_args([*run, *knobs])


def _worker(rank: int, store_path: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    torch.set_num_threads(1)
    args = _args()
    ctx = types.SimpleNamespace(rank=rank, world_size=2, device=torch.device("cpu"))
    model = bench.build(args, ctx.device)
    x, y = rank_batch(bench.SEED, rank, 1, 8, ctx.device)
    rows = [bench.measure_variant(model, v, b, args, ctx, x, y) for v, b in VARIANTS]
    rows.append(bench._memory_point(args, ctx, sharded=True))
    torch.save(
        {"rows": rows, "kind": type(model).__name__}, os.path.join(out_dir, f"rank{rank}.pt")
    )
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks():
    pytest.importorskip("transformers")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(plan_own.ENV, json.dumps(OWN))
        return run_forked_ranks(_worker, 2)


def test_our_ddp_trains_an_own_model(ranks):
    assert ranks[0]["kind"] == "GPT2LMHeadModel"
    for row in ranks[0]["rows"][: len(VARIANTS)]:
        assert "status" not in row, row.get("status")  # a diverged replica says so
        assert row["replica_spread"] == 0.0 and row["step_ms_mean"] > 0
    sharded = ranks[0]["rows"][-1]
    assert sharded["optimizer_state_mb"] > 0 and sharded["num_params"] > 1_000_000


def test_the_rows_carry_the_own_models_name(monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setenv(plan_own.ENV, json.dumps(OWN))
    cols = bench._job_columns(_args())
    assert cols["size"] == NAME and cols["own_model"] == OWN["factory"]
    assert cols["flops_source"] == "counted" and cols["params"] > 1_000_000


def test_the_section_renders_the_own_models_rows(ranks, monkeypatch, tmp_path):
    from cs336_systems.core.results import provenance, write_csv
    from cs336_systems.reporting.report import render
    from cs336_systems.stages.ddp import analysis

    monkeypatch.setenv(plan_own.ENV, json.dumps(OWN))
    cols = {**provenance("m", "cpu"), **bench._job_columns(_args()), "status": "ok"}
    rows = [{**cols, **r, "variant": v, "bucket_size_mb": b}
            for (v, b), r in zip(VARIANTS, ranks[0]["rows"])]  # fmt: skip
    rows.append({**cols, **ranks[0]["rows"][-1], "kind": "sharding", "variant": "sharded"})
    write_csv(pd.DataFrame(rows), tmp_path / "ddp.csv")
    analysis.plot(tmp_path, tmp_path / "figures")
    analysis.context(tmp_path)
    text = render(tmp_path, ["ddp"])
    assert f"own model **{NAME}**" in text and "FLOPs counted" in text
