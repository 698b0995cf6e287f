"""core/knobs.py: a stage's knobs declared once give its schema, its parsed block and the one
value a rule passes; the workflow checks a stage's blocks against its knobs' schema."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Literal

import pytest

from cs336_systems.core.knobs import Env, Knobs, Launcher, block_text, knob, parse_block
from cs336_systems.core.schema import Schema, schema_problems


@dataclass(frozen=True)
class Demo(Knobs):
    """A demo stage."""

    mode: Literal["a", "b"] = knob("which")
    sizes: list[float] = knob("sizes", minItems=1, items={"exclusiveMinimum": 0})
    steps: int = knob("steps", minimum=1)
    env: Env = knob("env")
    launcher: Launcher = knob("how ranks start")
    extra: int | None = knob("optional", default=None)


BLOCK = {"mode": "a", "sizes": [1, 2.5], "steps": 3, "env": {"X": 1},
         "launcher": {"topology": "local", "nnodes": 1}}  # fmt: skip


def test_the_schema_comes_from_the_fields():
    s = Demo.block_schema()
    assert s["required"] == ["mode", "sizes", "steps", "env", "launcher"]  # not `extra`
    assert s["properties"]["mode"] == {"type": "string", "enum": ["a", "b"], "description": "which"}
    assert s["properties"]["sizes"]["items"] == {"type": "number", "exclusiveMinimum": 0}
    assert s["properties"]["env"]["additionalProperties"] == {
        "type": ["string", "number", "boolean"]
    }
    assert s["properties"]["launcher"]["properties"]["nnodes"]["minimum"] == 1
    assert s["properties"]["extra"]["type"] == "integer"
    assert s["additionalProperties"] is False


def test_a_block_round_trips_and_a_bad_one_is_refused_with_its_line():
    k = parse_block(Demo, block_text(BLOCK))
    assert isinstance(k.launcher, Launcher) and k.launcher.nnodes == 1 and k.extra is None
    # numbers take their knob's type: YAML's 1 for a list of floats is 1.0
    assert k.sizes == [1.0, 2.5] and all(isinstance(x, float) for x in k.sizes)
    assert k.env == {"X": 1} and k.steps == 3 and isinstance(k.steps, int)
    assert json.loads(block_text(k.as_block())) == BLOCK
    assert parse_block(Demo, block_text(k.as_block())) == k
    with pytest.raises(argparse.ArgumentTypeError, match=r"block\.steps: 0 — "):
        parse_block(Demo, block_text({**BLOCK, "steps": 0}))
    with pytest.raises(argparse.ArgumentTypeError, match="unknown|not allowed|Additional"):
        parse_block(Demo, block_text({**BLOCK, "nope": 1}))
    problems, _ = schema_problems({"cpu": BLOCK}, Schema.of(Demo.schema("demo", ("cpu",))))
    assert problems == []
