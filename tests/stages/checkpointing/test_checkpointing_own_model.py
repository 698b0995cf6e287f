"""A model of one's own in the strategies job (docs/own-model.md): its repeated blocks (the
largest nn.ModuleList) checkpointed k at a time, the strategies that need the course's block
`skipped` rows with the reason."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from pipeline_utils import block

from cs336_systems.core import own_model
from cs336_systems.planning import own_model as plan_own
from cs336_systems.stages.checkpointing import measure

HF = "cs336_systems.models.hf:gpt2_tiny"
CONV = "cs336_systems.models.examples:conv_lm"


def flat(vocab_size):
    """No nn.ModuleList: embedding -> head."""
    return torch.nn.Sequential(
        torch.nn.Embedding(vocab_size, 8), torch.nn.Linear(8, vocab_size, bias=False)
    )


pytestmark = pytest.mark.usefixtures("one_thread")


def strategies_rows(monkeypatch, factory: str, name: str = "mine") -> dict:
    monkeypatch.setenv(plan_own.ENV, json.dumps({"name": name, "factory": factory}))
    run = ["--machine", "m", "--preset", "cpu", "--out", "x", "--precision", "fp32"]
    changes = dict(size=name, block_sizes=[1, 2, 4], context_length=16, measure_steps=1)
    args = measure.parse_args(["strategies", *run, *block("checkpointing", **changes)])
    rows = measure.strategies(args)
    assert {r["size"] for r in rows} == {name}
    return {r["strategy"]: r for r in rows}


def test_a_huggingface_model_is_checkpointed_k_blocks_at_a_time(monkeypatch):
    pytest.importorskip("transformers")
    rows = strategies_rows(monkeypatch, HF)
    ran = {s for s, r in rows.items() if r["status"] == "ok"}
    assert ran == {"none", "every_1", "every_2", "sqrt"}  # GPT-2 tiny: 2 blocks
    assert rows["every_2"]["blocks"] == "transformer.h (2)"
    assert rows["every_2"]["checkpoint_calls"] == 1 and rows["every_1"]["checkpoint_calls"] == 2
    assert "does not divide the 2 blocks" in rows["every_4"]["status"]
    assert "course's block stack" in rows["chain"]["status"]
    assert "TransformerBlock" in rows["ffn"]["status"]
    # what a forward leaves saved shrinks as blocks are checkpointed
    saved = [rows[s]["forward_saved_mb"] for s in ("none", "every_1", "every_2")]
    assert saved[0] > saved[1] > saved[2]


def test_blocks_that_do_not_feed_each_other_run_one_at_a_time(monkeypatch):
    rows = strategies_rows(monkeypatch, CONV)
    assert rows["every_1"]["status"] == "ok" and rows["every_1"]["blocks"] == "mlps (2)"
    assert "do not feed each other" in rows["every_2"]["status"]


def test_segments_keep_the_gradients():
    pytest.importorskip("transformers")
    from cs336_systems.models.hf import gpt2_tiny

    torch.manual_seed(0)
    model = gpt2_tiny(64, 16)
    x = torch.randint(0, 64, (2, 16))
    name, blocks = own_model.repeated_blocks(model)
    assert name == "transformer.h" and own_model.feeds_in_order(model, blocks, x)
    own_model.loss_of(model, x, x).backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    own_model.checkpoint_segments(blocks, [2])
    own_model.loss_of(model, x, x).backward()
    for a, p in zip(plain, model.parameters()):
        torch.testing.assert_close(p.grad, a)
    own_model.restore_blocks(blocks)
    assert all("_own_forward" not in b.__dict__ for b in blocks)


def test_a_model_without_a_module_list_writes_skipped_rows(monkeypatch):
    rows = strategies_rows(monkeypatch, "test_checkpointing_own_model:flat")
    assert rows["none"]["status"] == "ok"
    assert "no nn.ModuleList" in rows["every_1"]["status"]


def test_the_section_renders_the_own_models_rows(monkeypatch, tmp_path):
    """The report of a run whose strategies ran an own model: its rows, no analytic model."""
    pytest.importorskip("transformers")
    from cs336_systems.reporting.report import render
    from cs336_systems.stages.checkpointing import analysis

    rows = strategies_rows(monkeypatch, HF, name="hf-tiny")
    pd.DataFrame(rows.values()).to_csv(tmp_path / "checkpointing.csv", index=False)
    analysis.plot(tmp_path, tmp_path / "figures")
    s = analysis.context(tmp_path)
    assert s["available"] and s["setting"].startswith("hf-tiny (`cs336_systems.models.hf")
    text = render(tmp_path, ["checkpointing"])
    assert "Own model **hf-tiny**" in text and "FLOPs counted" in text
    assert "transformer.h (2)" in text


def test_the_check_takes_the_own_models_name_as_the_size():
    import yaml

    from cs336_systems.stages.checkpointing import plan

    cfg = {**yaml.safe_load(open("config/stages/checkpointing.yaml"))["checkpointing"]["cpu"]}
    cfg["size"] = "mine"
    assert [p[0] for p in plan.problems(cfg)] == [("size",)]
    assert plan.problems(cfg, own=("tiny", "mine")) == []
    cfg["accounting"] = {**cfg["accounting"], "size": "mine"}  # the accounting job's: a course size
    assert [p[0] for p in plan.problems(cfg, own=("mine",))] == [("accounting", "size")]
