"""A stage's knobs declared once: one frozen dataclass per stage (`Knobs`), each field a knob with
its one-line doc and its limits. From it come the JSON schema its preset blocks are checked
against (`schema`: the config check of planning/config.py reads it where a stage declares one), the
typed block a stage's CLI reads (`from_block`), and the one value a rule hands that CLI
(`--block`, the checked block as JSON: `add_block_argument`, `block_text`).

    @dataclass(frozen=True)
    class DdpKnobs(Knobs):
        world_size: int = knob("ranks of each run", minimum=2)
        variants: list[Literal["naive", "flat"]] = knob("...", minItems=1, uniqueItems=True)

A knob's limits are JSON-schema keywords (`minimum`, `exclusiveMinimum`, `minItems`,
`uniqueItems`, `pattern`, `allowed` for the words a problem line shows); `items=` adds keywords
to a list's items, `values=` to a mapping's values (both merged into nested keywords);
`oneOf=[...]` gives a union's alternatives whole (each with its own limits) instead of the schema
its type would give. Types: bool, int, float, str, `Literal[...]`, `list[T]`, `dict[str, T]`,
`dict[Literal[...], T]` (only those keys, each optional), `A | B` (the JSON types of both;
`oneOf` where one is a `Literal`), another `Knobs` (a nested mapping; `list[K]` a list of them),
`X | None` (optional: may be left out of the block). Standard library only: the workflow reads
these while planning.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import operator
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

_SCALARS = {bool: "boolean", int: "integer", float: "number", str: "string"}


def knob(
    doc: str,
    *,
    default: Any = dataclasses.MISSING,
    items: dict | None = None,
    values: dict | None = None,
    **limits,
):
    """A field of a `Knobs` class: its doc (the schema's description) and JSON-schema limits.
    No default: the block must give it (every preset block states every knob)."""
    meta = {"doc": doc, "limits": limits, "items": items or {}, "values": values or {}}
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _optional(tp) -> tuple[Any, bool]:
    """(the type without None, whether None was in it)."""
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) < len(get_args(tp)):
            return (args[0] if len(args) == 1 else functools.reduce(operator.or_, args)), True
    return tp, False


def _merge(schema: dict, more: dict) -> dict:
    """`schema` with the keywords of `more`, nested mappings merged (an item's `items`)."""
    out = dict(schema)
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


_NUMBER_LIMITS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")


def _add_limits(schema: dict, limits: dict) -> None:
    """`limits` into `schema`; a number's bounds into the number branches of a `oneOf` (a word
    or a number: the bound is the number's, and a problem line says so)."""
    for key, value in limits.items():
        branches = [b for b in schema.get("oneOf", []) if b.get("type") in ("integer", "number")]
        if key in _NUMBER_LIMITS and branches:
            for b in branches:
                b[key] = value
        else:
            schema[key] = value


def _type_schema(tp) -> dict:
    """The JSON schema of one Python type (see the module's list)."""
    origin = get_origin(tp)
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    if origin is Literal:
        values = list(get_args(tp))
        kinds = sorted({_SCALARS[type(v)] for v in values})
        return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": values}
    if origin is list:
        (item,) = get_args(tp)
        return {"type": "array", "items": _type_schema(item)}
    if origin is dict:
        key, value = get_args(tp)
        if get_origin(key) is Literal:  # only these keys, each optional
            props = {k: _type_schema(value) for k in get_args(key)}
            return {"type": "object", "additionalProperties": False, "properties": props}
        return {"type": "object", "additionalProperties": _type_schema(value)}
    if origin in (typing.Union, types.UnionType):
        if any(get_origin(a) is Literal for a in get_args(tp)):
            return {"oneOf": [_type_schema(a) for a in get_args(tp)]}
        kinds = [_type_schema(a)["type"] for a in get_args(tp)]
        return {"type": [k for k in kinds if isinstance(k, str)]}
    if isinstance(tp, type) and issubclass(tp, Knobs):
        return tp.block_schema()
    raise TypeError(f"no JSON schema for knob type {tp!r}")


def _typed(tp, v):
    """A checked block's value as its knob's type: YAML's 1 for a float knob is 1.0 (in lists
    and mappings too), a nested mapping its Knobs."""
    origin = get_origin(tp)
    if tp is float and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    if origin is list and isinstance(v, list):
        (item,) = get_args(tp)
        return [_typed(item, x) for x in v]
    if origin is dict and isinstance(v, Mapping):
        _, value = get_args(tp)
        return {k: _typed(value, x) for k, x in v.items()}
    if isinstance(tp, type) and issubclass(tp, Knobs) and isinstance(v, Mapping):
        return tp.from_block(v)
    return v


@dataclasses.dataclass(frozen=True)
class Knobs:
    """Base of a stage's knobs (a frozen dataclass of `knob` fields): schema, parsing, JSON."""

    @classmethod
    def _hints(cls) -> dict[str, Any]:
        return typing.get_type_hints(cls)

    @classmethod
    def block_schema(cls) -> dict:
        """The JSON schema of one block (a preset's mapping) of these knobs."""
        hints = cls._hints()
        props, required = {}, []
        for f in dataclasses.fields(cls):
            tp, optional = _optional(hints[f.name])
            limits = f.metadata.get("limits", {})
            # a knob whose limits give its alternatives (`oneOf`) is described by them alone
            s = {} if "oneOf" in limits else _type_schema(tp)
            _add_limits(s, limits)
            if f.metadata.get("items"):
                s["items"] = _merge(s["items"], f.metadata["items"])
            if f.metadata.get("values"):
                key = "properties" if "properties" in s else "additionalProperties"
                if key == "properties":
                    s[key] = {k: _merge(v, f.metadata["values"]) for k, v in s[key].items()}
                else:
                    s[key] = _merge(s[key], f.metadata["values"])
            if f.metadata.get("doc"):
                s["description"] = f.metadata["doc"]
            props[f.name] = s
            if not optional and f.default is dataclasses.MISSING:
                required.append(f.name)
        schema = {"type": "object", "additionalProperties": False, "required": required}
        if not required:  # every knob may be left out
            del schema["required"]
        return {**schema, "properties": props}

    @classmethod
    def schema(cls, stage: str, presets: tuple[str, ...]) -> dict:
        """The schema of a stage's config file section: one block per preset."""
        return {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "description": f"the `{stage}` stage, per preset: {cls.__doc__.split(chr(10))[0]}",
            "type": "object",
            "additionalProperties": False,
            "properties": {p: {"$ref": "#/$defs/block"} for p in presets},
            "$defs": {"block": cls.block_schema()},
        }

    @classmethod
    def from_block(cls, block: Mapping) -> Knobs:
        """These knobs from a checked block (a mapping; nested Knobs from nested mappings)."""
        hints = cls._hints()
        values = {}
        for f in dataclasses.fields(cls):
            if f.name not in block:
                continue
            tp, _ = _optional(hints[f.name])
            values[f.name] = _typed(tp, block[f.name])
        return cls(**values)

    @classmethod
    def part(cls, *names: str) -> type[Knobs]:
        """These knobs narrowed to `names`, the same fields (types, docs, limits): the part of a
        block one job of a stage reads. A rule passes each job its part, so that a knob the job
        does not read (the sweep's other sizes, another job's settings) changes none of its
        params, and Snakemake reruns only the jobs a change concerns."""
        hints = cls._hints()
        chosen = {f.name: f for f in dataclasses.fields(cls) if f.name in names}
        if unknown := set(names) - set(chosen):
            raise ValueError(f"{cls.__name__} has no knob {sorted(unknown)}")
        fields = [
            (f.name, hints[f.name], dataclasses.field(default=f.default, metadata=f.metadata))
            for f in chosen.values()
        ]
        part = dataclasses.make_dataclass(
            f"{cls.__name__}Part", fields, bases=(Knobs,), frozen=True
        )
        part.__doc__ = cls.__doc__
        return part

    @classmethod
    def select(cls, block: Mapping | Knobs) -> dict:
        """The keys of `block` (a mapping, or knobs) that are these knobs: a job's part of a
        preset block."""
        if isinstance(block, Knobs):
            block = block.as_block()
        names = {f.name for f in dataclasses.fields(cls)}
        return {k: v for k, v in block.items() if k in names}

    def as_block(self) -> dict:
        """The block again (nested Knobs as mappings, knobs left unset left out): what
        `block_text` sends."""
        return _drop_none(dataclasses.asdict(self))


def _drop_none(block: dict) -> dict:
    return {
        k: _drop_none(v) if isinstance(v, dict) else v for k, v in block.items() if v is not None
    }


def block_text(block: Mapping | Knobs) -> str:
    """A checked block (a mapping, or knobs) as the one JSON value a rule passes to its stage's
    `--block`."""
    if isinstance(block, Knobs):
        block = block.as_block()
    return json.dumps(block, sort_keys=True, separators=(",", ":"))


def add_run_arguments(ap: argparse.ArgumentParser) -> None:
    """A stage CLI's own arguments, the same in every stage: where its rows go (`--out`) and
    what they say they come from (machine tag, preset, edition)."""
    from cs336_systems.planning.edition import add_edition_argument

    ap.add_argument("--machine", required=True, help="the machine tag the rows carry")
    ap.add_argument("--preset", required=True, help="the preset whose block the run uses")
    add_edition_argument(ap)
    ap.add_argument("--out", type=Path, help="the CSV the rows go to")


def add_block_argument(ap: argparse.ArgumentParser, cls: type[Knobs]) -> None:
    """`--block JSON`: the stage's checked preset block (the rule's `block_text`), read as `cls`."""
    ap.add_argument(
        "--block",
        required=True,
        type=lambda text: parse_block(cls, text),
        help=f"the stage's preset block as JSON ({cls.__name__})",
    )


def parse_block(cls: type[Knobs], text: str) -> Knobs:
    """`cls` from a block's JSON text, checked against its schema first (a block typed by hand
    gets the workflow's problem lines)."""
    from cs336_systems.planning.schema import Schema, schema_problems

    try:
        block = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    problems, _ = schema_problems(block, Schema.of(cls.block_schema()), ("block",))
    if problems:
        raise argparse.ArgumentTypeError("; ".join(map(str, problems)))
    return cls.from_block(block)


@dataclasses.dataclass(frozen=True)
class Launcher(Knobs):
    """How a distributed stage starts its ranks (parallel/launch.py)."""

    topology: Literal["local", "slurm"] = knob(
        "local - the stage starts the ranks, file rendezvous; slurm - srun + torchrun, c10d"
    )
    nnodes: int = knob("nodes the ranks spread over", minimum=1)


# a stage's `env` knob: variables set in every rank's environment
Env = dict[str, str | float | bool]
