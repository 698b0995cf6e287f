"""A model of one's own (core/own_model.py, planning/own_model.py): bad factories refused
naming the key, FLOPs counted from the module or declared, the model run as a Workload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from cs336_systems.core import own_model
from cs336_systems.core.workload import Workload, model_columns
from cs336_systems.model import VOCAB_SIZE
from cs336_systems.planning import own_model as plan_own

HERE = Path(__file__).parent
NAME = "lm-of-mine"


class HeadOnly(nn.Module):
    """Embedding -> linear head: forward FLOPs are the head's matmul, 2 B T d V."""

    def __init__(self, vocab_size: int, d: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d)
        self.head = nn.Linear(d, vocab_size, bias=False)

    def forward(self, tokens):
        return self.head(self.embed(tokens))


def head_only(vocab_size):
    return HeadOnly(vocab_size)


def not_a_module():
    return {"weights": 1}


def no_parameters():
    return nn.ReLU()


def needs_an_argument(width):  # the study passes only vocab_size and context_length
    return HeadOnly(width)


NOT_CALLABLE = 3


def dict_batch(batch_size, context_length, vocab_size, device):
    x = torch.randint(0, vocab_size, (batch_size, context_length), device=device)
    return {"tokens": x}, x


def wrong_key_batch(batch_size, context_length, vocab_size, device):
    x = torch.randint(0, vocab_size, (batch_size, context_length), device=device)
    return {"input_ids": x}, x


def spec(factory: str, **more) -> dict:
    return {"name": NAME, "factory": factory, **more}


@pytest.mark.parametrize(
    "factory, says",
    [
        ("no_such_module_here:f", "that imports (ModuleNotFoundError"),
        ("test_own_model:missing", "that imports (AttributeError"),
        ("test_own_model:NOT_CALLABLE", "naming a callable, not a int"),
        ("test_own_model:not_a_module", "returning an nn.Module, not dict"),
        ("test_own_model:no_parameters", "returning a model with parameters"),
        ("test_own_model:needs_an_argument", "a factory that builds"),
    ],
)
def test_bad_factories_are_refused_naming_the_key(factory, says):
    found = own_model.problems(spec(factory))
    assert [p["key"] for p in found] == ["factory"]
    assert found[0]["value"] == factory and says in found[0]["allowed"]


def test_a_bad_batch_builder_names_its_key():
    found = own_model.problems(spec("test_own_model:head_only", batch="test_own_model:nope"))
    assert [p["key"] for p in found] == ["batch"]


def test_a_good_factory_passes_the_check():
    assert own_model.problems(spec("test_own_model:head_only")) == []
    good = spec("test_own_model:head_only", batch="test_own_model:dict_batch")
    assert own_model.problems(good) == []
    # a batch the model cannot take: its forward on the meta device fails at the check
    bad = own_model.problems(
        spec("test_own_model:head_only", batch="test_own_model:wrong_key_batch")
    )
    assert [p["key"] for p in bad] == ["factory"]
    assert "token ids (B, T) to logits" in bad[0]["allowed"] and "input_ids" in bad[0]["allowed"]


def test_planning_checks_in_a_process_of_its_own(monkeypatch):
    """The workflow's check (no torch while planning): each problem under `own_model`."""
    monkeypatch.setenv("PYTHONPATH", str(HERE))
    found = plan_own.factory_problems(spec("test_own_model:not_a_module"))
    assert [(p[0], p[1]) for p in found] == [
        (("own_model", "factory"), "test_own_model:not_a_module")
    ]
    assert "returning an nn.Module, not dict" in found[0][2]
    assert plan_own.factory_problems(spec("test_own_model:head_only")) == []


def test_flops_counted_from_the_module():
    about = own_model.describe(own_model.OwnModel(NAME, "test_own_model:head_only"), 16, 2)
    head = 2 * 2 * 16 * 8 * VOCAB_SIZE  # 2 B T d V
    assert about["flops_source"] == "counted"
    assert about["flops"]["forward"] == head
    # backward: the gradients of the head's input and weight, two more matmuls of its size
    assert about["flops"]["forward_backward"] == 3 * head
    assert about["params"] == 2 * 8 * VOCAB_SIZE


def test_flops_declared_per_token():
    own = own_model.OwnModel(NAME, "test_own_model:head_only", flops_per_token=1000.0)
    about = own_model.describe(own, 16, 2)
    assert about["flops_source"] == "declared"
    assert about["flops"] == {
        "forward": 32_000.0,
        "forward_backward": 96_000.0,
        "train_step": 96_000.0,
    }


def test_the_grids_gain_its_name():
    config = {
        "own_model": spec("m:f"),
        "benchmark": {"cpu": {"sizes": ["tiny"]}, "gpu": {"sizes": ["small", NAME]}},
        "ddp": {"cpu": {"size": "tiny"}},
    }
    config["profile"] = {"cpu": {"sizes": ["tiny"]}}
    plan_own.add_to_grids(config, ["benchmark", "ddp", "profile"])
    assert config["profile"]["cpu"]["sizes"] == ["tiny", NAME]
    assert config["benchmark"]["cpu"]["sizes"] == ["tiny", NAME]
    assert config["benchmark"]["gpu"]["sizes"] == ["small", NAME]
    assert config["ddp"] == {"cpu": {"size": "tiny"}}


def run_steps(device: str, factory: str, batch: str | None = None) -> dict:
    spec_ = spec(factory, **({"batch": batch} if batch else {}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(plan_own.ENV, json.dumps(spec_))
        work = Workload.build(NAME, 16, 2, device)
        assert work.own
        for mode in ("forward", "forward_backward", "train_step"):
            step, cleanup = work.step(mode, "fp32", False)
            step()
            cleanup()
        return model_columns(NAME, None, context_length=16, batch_size=2)


def test_a_workload_runs_it_with_its_batch_builder():
    cols = run_steps("cpu", "test_own_model:head_only", "test_own_model:dict_batch")
    assert cols["size"] == NAME and cols["flops_source"] == "counted"
    assert cols["params"] == 2 * 8 * VOCAB_SIZE


def test_a_huggingface_model_runs_as_a_workload():
    """The worked example's factory (docs/own-model.md): HF's output read for its logits."""
    pytest.importorskip("transformers")
    cols = run_steps("cpu", "cs336_systems.models.hf:gpt2_tiny")
    assert cols["flops_source"] == "counted" and cols["params"] > 1_000_000


@pytest.mark.gpu
def test_a_huggingface_model_trains_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pytest.importorskip("transformers")
    cols = run_steps("cuda", "cs336_systems.models.hf:gpt2_tiny")
    assert cols["flops_source"] == "counted" and cols["params"] > 0


def test_the_repeated_blocks_are_the_largest_module_list():
    from cs336_systems.model import build_model
    from cs336_systems.models.examples import conv_lm

    with torch.device("meta"):
        course = build_model("tiny", 16)
        conv = conv_lm(VOCAB_SIZE)
    assert own_model.repeated_blocks(course)[0] == "layers"
    # two lists of two: the MLPs hold more parameters than the depthwise convolutions
    assert own_model.repeated_blocks(conv)[0] == "mlps"
    assert own_model.repeated_blocks(HeadOnly(VOCAB_SIZE)) is None
