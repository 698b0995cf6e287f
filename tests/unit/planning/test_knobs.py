"""planning/knobs.py: a stage's knobs declared once give its schema, its parsed block and the one
value a rule passes; the workflow checks a stage's blocks against its knobs' schema."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Literal

import pytest

from cs336_systems.planning.knobs import Env, Knobs, Launcher, block_text, knob, parse_block
from cs336_systems.planning.schema import Schema, schema_problems


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


@dataclass(frozen=True)
class Shape(Knobs):
    """A shape."""

    name: str = knob("its name")
    n: int = knob("its size", minimum=1)


@dataclass(frozen=True)
class More(Knobs):
    """Mappings with named keys, a list of nested knobs, a word or a number."""

    extra: dict[Literal["a"], list[int]] = knob("lists", values={"items": {"minimum": 16}})
    shapes: list[Shape] = knob("shapes", minItems=1)
    workers: Literal["auto"] | int = knob("auto or a number", minimum=1)
    size_of: dict[Literal["a", "b"], int] | None = knob(
        "per key", default=None, values={"minimum": 16}
    )


def test_named_keys_nested_lists_and_a_word_or_a_number():
    s = More.block_schema()["properties"]
    assert s["size_of"] == {"type": "object", "additionalProperties": False, "description": "per key",
                            "properties": {k: {"type": "integer", "minimum": 16} for k in "ab"}}  # fmt: skip
    assert s["extra"]["properties"]["a"]["items"] == {"type": "integer", "minimum": 16}
    assert s["workers"]["oneOf"] == [
        {"type": "string", "enum": ["auto"]},
        {"type": "integer", "minimum": 1},  # the number's bound
    ]
    ok = {"extra": {"a": [16]}, "shapes": [{"name": "x", "n": 1}], "workers": "auto"}
    k = parse_block(More, block_text(ok))
    assert k.shapes == [Shape("x", 1)] and k.size_of is None
    assert json.loads(block_text(k.as_block())) == ok
    for bad in ({"size_of": {"c": 16}}, {"size_of": {"a": 8}}, {"extra": {"a": [1]}},
                {"workers": "all"}, {"workers": 0}, {"shapes": [{"name": "x"}]}):  # fmt: skip
        with pytest.raises(argparse.ArgumentTypeError):
            parse_block(More, block_text({**ok, **bad}))


def test_a_part_checks_and_reads_only_its_knobs():
    Part = Demo.part("steps", "launcher", "extra")
    s = Part.block_schema()
    assert set(s["properties"]) == {"steps", "launcher", "extra"}
    assert s["properties"]["steps"] == Demo.block_schema()["properties"]["steps"]
    k = parse_block(Part, block_text({"steps": 2, "launcher": BLOCK["launcher"]}))
    assert (
        k.steps == 2
        and k.extra is None
        and k.as_block() == {"steps": 2, "launcher": BLOCK["launcher"]}
    )
    with pytest.raises(argparse.ArgumentTypeError, match="unknown|not allowed|Additional"):
        parse_block(Part, block_text({"steps": 2, "launcher": BLOCK["launcher"], "mode": "a"}))
    with pytest.raises(ValueError):
        Demo.part("nope")


@dataclass(frozen=True)
class Inner(Knobs):
    """Nested knobs, one optional."""

    b: int = knob("b")
    a: int | None = knob("a", default=None)


@dataclass(frozen=True)
class Outer(Knobs):
    """Knobs holding nested ones."""

    inner: Inner = knob("inner")


def test_knobs_left_unset_are_left_out_at_every_depth():
    assert Outer.from_block({"inner": {"b": 1}}).as_block() == {"inner": {"b": 1}}


@dataclass(frozen=True)
class Either(Knobs):
    """A knob that is a list or a word."""

    contexts: list[int] | Literal["probe"] = knob(
        "a list, or `probe`",
        oneOf=[
            {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 1}},
            {"type": "string", "const": "probe"},
        ],
    )


def test_a_union_with_its_alternatives_whole_checks_each_branch():
    s = Either.block_schema()["properties"]["contexts"]
    assert "type" not in s and len(s["oneOf"]) == 2  # the alternatives alone describe it
    assert parse_block(Either, '{"contexts": "probe"}').contexts == "probe"
    assert parse_block(Either, '{"contexts": [8, 16]}').contexts == [8, 16]
    with pytest.raises(argparse.ArgumentTypeError, match=r"block\.contexts\[0\]: 0 — "):
        parse_block(Either, '{"contexts": [0]}')
    with pytest.raises(argparse.ArgumentTypeError, match=r"block\.contexts: 'all' — "):
        parse_block(Either, '{"contexts": "all"}')
