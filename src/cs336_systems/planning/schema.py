"""Configuration problems as lines, and JSON schemas that say what they allow in words.

    config: <stage>.<preset>.<key>[<index>]: <value> — <what is allowed>

`Problem` is one such line and `ConfigError` all of them, raised before any job runs.
`schema_problems` validates a config block against its schema (`workflow/schemas/`) and
translates every error into a line; an integer written `2.0`, and command-line text where the
schema wants a number ('128' from a nested `--config` value), are read as what they mean and
reported as notes. planning/config.py runs the whole check. Standard library, yaml and jsonschema
only: the workflow runs this while planning.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DASH = " — "


class ConfigError(ValueError):
    """Configuration problems, reported before any job runs: one line each."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        n = len(problems)
        head = f"{n} configuration problem{'s' if n > 1 else ''}; nothing ran:"
        super().__init__("\n".join([head, *map(str, problems)]))


@dataclass(frozen=True)
class Problem:
    path: tuple
    value: Any
    allowed: str

    def __str__(self) -> str:
        return f"config: {key_path(self.path)}: {show(self.value)}{DASH}{self.allowed}"


MISSING = object()


def key_path(path: Iterable) -> str:
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out


def show(value: Any, limit: int = 80) -> str:
    """A value as the user wrote it (YAML-ish), shortened."""
    if value is MISSING:
        return "(missing)"
    if isinstance(value, str):
        text = repr(value)
    else:
        try:
            text = json.dumps(value, default=str)
        except (TypeError, ValueError):
            text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def names(values: Iterable) -> str:
    return ", ".join(str(v) for v in values)


def load_yaml(path: str | Path):
    """A YAML file through libyaml where it is there (ten times faster than pure Python)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(Path(path).read_text(), Loader=loader)


# ---- JSON schemas --------------------------------------------------------------------------


@dataclass
class Schema:
    """A JSON schema loaded once, with a validator whose integers are strict (2.0 is not one)."""

    schema: dict
    validator: Any = None

    @classmethod
    def load(cls, path: str | Path) -> Schema:
        return cls.of(load_yaml(path))

    @classmethod
    def of(cls, schema: dict) -> Schema:
        import jsonschema

        base = jsonschema.validators.validator_for(schema)
        checker = base.TYPE_CHECKER.redefine(
            "integer", lambda _, x: isinstance(x, int) and not isinstance(x, bool)
        )
        strict = jsonschema.validators.extend(base, type_checker=checker)
        return cls(schema, strict(schema))


def _types(schema: Mapping) -> list[str]:
    t = schema.get("type", [])
    return [t] if isinstance(t, str) else list(t)


TYPE_WORDS = {
    "integer": ("an integer", "integers"),
    "number": ("a number", "numbers"),
    "string": ("a string", "strings"),
    "array": ("a list", "lists"),
    "object": ("a mapping (key: value)", "mappings"),
    "boolean": ("true or false", "true/false values"),
    "null": ("null", "nulls"),
}


def describe(schema: Mapping, root: Mapping | None = None, plural: bool = False) -> str:
    """What a (sub)schema allows, in words (`plural`: as the items of a list)."""
    schema = resolve(schema, root)
    if "allowed" in schema:
        return schema["allowed"]
    if "enum" in schema:
        return f"one of {names(schema['enum'])}"
    types = _types(schema)
    text = " or ".join(TYPE_WORDS.get(t, (t, t))[plural] for t in types) or "a value"
    bounds = []
    for key, sign in (
        ("minimum", ">="),
        ("exclusiveMinimum", ">"),
        ("maximum", "<="),
        ("exclusiveMaximum", "<"),
    ):
        if key in schema:
            bounds.append(f"{sign} {schema[key]:g}")
    if bounds:
        text += " " + " and ".join(bounds)
    if "array" in types and not plural:
        lo, hi = schema.get("minItems"), schema.get("maxItems")
        text = "a list"
        if lo is not None and lo == hi:
            text = f"a list of exactly {lo}"
        elif lo == 1:
            text = "a non-empty list"
        elif lo:
            text = f"a list of at least {lo}"
        once = ", each once" if schema.get("uniqueItems") else ""
        items = resolve(schema.get("items", {}), root)
        if "enum" in items and "allowed" not in items:
            text += f"{once}, of: {names(items['enum'])}"
        elif items:
            text += f" of {describe(items, root, plural=True)}{once}"
        else:
            text += once
    if "pattern" in schema:
        text += f" matching {schema['pattern']}"
    if "maxLength" in schema:
        text += f" of at most {schema['maxLength']} characters"
    return text


def resolve(schema: Mapping, root: Mapping | None) -> Mapping:
    ref = schema.get("$ref")
    if ref and root is not None and ref.startswith("#/"):
        target = root
        for part in ref[2:].split("/"):
            target = target[part]
        return {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def _translate(err, prefix: tuple, root: Mapping) -> list[Problem]:
    """One jsonschema error as problem lines."""
    path = prefix + tuple(err.absolute_path)
    kind, schema, value = err.validator, err.schema, err.instance
    if "propertyNames" in err.relative_schema_path and kind != "propertyNames":
        # a key of a mapping failed: the error is the key's own (enum, pattern), at the mapping
        return [Problem(path + (value,), value, "a key that is " + describe(schema, root))]
    if kind in ("oneOf", "anyOf"):
        # the branch meant for this kind of value, when there is one, says what went wrong
        for i, branch in enumerate(err.validator_value):
            branch = resolve(branch, root)
            if _type_matches(value, _types(branch)):
                sub = [e for e in (err.context or []) if e.relative_schema_path[0] == i]
                if sub:
                    return [p for e in sub for p in _translate(e, prefix, root)]
        return [Problem(path, value, describe(schema, root))]
    if kind == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        extra = [k for k in value if k not in schema.get("properties", {})]
        what = f"unknown key; allowed: {names(allowed)}" if allowed else "unknown key"
        return [Problem(path + (k,), value[k], what) for k in extra]
    if kind == "required":
        missing = [k for k in err.validator_value if k not in value]
        props = schema.get("properties", {})
        return [
            Problem(path + (k,), MISSING, "required: " + describe(props.get(k, {}), root))
            for k in missing
        ]
    if kind == "uniqueItems":
        seen: dict = {}
        out = []
        for i, v in enumerate(value):
            key = json.dumps(v, sort_keys=True, default=str)
            if key in seen:
                out.append(
                    Problem(path + (i,), v, f"listed twice (also at [{seen[key]}]); each once")
                )
            else:
                seen[key] = i
        return out
    if kind in DESCRIBED:
        return [Problem(path, value, describe(schema, root))]
    return [Problem(path, value, err.message)]


# errors that say no more than "not what the schema allows": the schema says what it allows
DESCRIBED = {
    "type",
    "enum",
    "const",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "pattern",
    "minProperties",
}


def _type_matches(value: Any, types: list[str]) -> bool:
    checks = {
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    }
    return any(checks.get(t, lambda v: False)(value) for t in types)


def _set(container, path: tuple, value) -> None:
    for key in path[:-1]:
        container = container[key]
    container[path[-1]] = value


def text_paths(command_line: Any, path: tuple = ()) -> frozenset[tuple]:
    """The key paths of the text values of `--config` (Snakemake reads a nested value, such as
    `benchmark={cpu: {context_lengths: [128]}}`, with YAML's base loader: every scalar in it,
    128 included, arrives as the string '128')."""
    if isinstance(command_line, Mapping):
        items = command_line.items()
    elif isinstance(command_line, list | tuple):
        items = enumerate(command_line)
    else:
        return frozenset([path]) if isinstance(command_line, str) else frozenset()
    return frozenset().union(*(text_paths(v, (*path, k)) for k, v in items))


def _from_text(text: str, types: list[str]) -> tuple[Any, str]:
    """(value, its kind in words) of command-line text where the schema wants one of `types`
    (an integer, a number, true/false, null); (MISSING, '') when the text reads as none."""
    t = text.strip()
    for kind in ("integer", "number"):
        if kind not in types:
            continue
        try:
            return int(t), "the integer"
        except ValueError:
            pass
        try:
            x = float(t)
        except ValueError:
            continue
        if math.isfinite(x) and (kind == "number" or x.is_integer()):
            return (x if kind == "number" else int(x)), f"the {kind}"
    if "boolean" in types and t.lower() in ("true", "false"):
        return t.lower() == "true", "the boolean"
    if "null" in types and t.lower() in ("null", "~"):
        return None, "null"
    return MISSING, ""


def _errors_within(err):
    """A jsonschema error and, for anyOf/oneOf, its branches' errors, however deep."""
    yield err
    for sub in err.context or []:
        yield from _errors_within(sub)


def schema_problems(
    instance: Any, schema: Schema, prefix: tuple = (), text: frozenset[tuple] = frozenset()
) -> tuple[list[Problem], list[Problem]]:
    """(problems, notes) of `instance` against `schema`. An integral float where an integer is
    expected (`2.0`) is replaced by the integer in `instance` and reported as a note; so is
    command-line text (`text`: its key paths, `text_paths`) where the schema wants a number,
    true/false or null ('128' read as 128)."""
    notes: list[Problem] = []
    for _ in range(10_000):
        errors = list(schema.validator.iter_errors(instance))
        converted = False
        done: set[tuple] = set()
        for err in (e for top in errors for e in _errors_within(top)):
            where = tuple(err.absolute_path)
            if (
                err.validator == "type"
                and isinstance(err.instance, str)
                and where
                and where not in done
                and prefix + where in text
            ):
                value, kind = _from_text(err.instance, _types(err.schema))
                if value is not MISSING:
                    done.add(where)
                    _set(instance, where, value)
                    notes.append(
                        Problem(
                            prefix + where,
                            err.instance,
                            f"text from the command line (--config), read as {kind} "
                            f"{json.dumps(value)}",
                        )
                    )
                    converted = True
        for err in errors:
            value = err.instance
            if (
                err.validator == "type"
                and "integer" in _types(err.schema)
                and isinstance(value, float)
                and math.isfinite(value)
                and value.is_integer()
                and err.absolute_path
            ):
                _set(instance, tuple(err.absolute_path), int(value))
                notes.append(
                    Problem(
                        prefix + tuple(err.absolute_path),
                        value,
                        f"read as the integer {int(value)}",
                    )
                )
                converted = True
        if not converted:
            break
    problems: list[Problem] = []
    for err in errors:
        for p in _translate(err, prefix, schema.schema):
            if p not in problems:
                problems.append(p)
    return sorted(problems, key=lambda p: _order(p.path)), notes


def _order(path: tuple) -> tuple:
    return tuple((0, k, "") if isinstance(k, int) else (1, 0, str(k)) for k in path)
