"""The run's configuration, checked once before any job: every problem is one line

    config: <stage>.<preset>.<key>[<index>]: <value> — <what is allowed>

and all of them are reported together (`ConfigError`). Three layers of checks:

1. the JSON schemas (`workflow/schemas/<stage>.schema.yaml`, `config.schema.yaml`): types,
   ranges, names, non-empty lists, duplicates, unknown keys. Their errors are translated into
   the line above (`schema_problems`); an integer written `2.0` is read as `2` and said so (a
   note), `2.5` is refused.
2. the global keys (`check_run`): preset, machine tag (a short folder name), stages (known,
   each once), and the facts they imply for every stage (`Facts`: the chosen preset, the model
   sizes, this machine's memory where knowable).
3. each stage's own checks, `check(block, at, facts)` in `stages/<stage>/plan.py`, on each of
   its preset blocks once the schema passed: cross-key consistency (filters name values of the
   sweep, min <= max), what the launcher and the kernels accept, sizes that fit memory. `at`
   (a `Checker`) collects the problems under the block's path.

A global key that decides things for several stages (the `edition`: which model sizes exist)
becomes a field of `Facts` (`facts_for`); stage checks read facts, never the global config. A
preset block's `editions: {2025: {...}}` replaces its keys for that edition before the check.
Standard library, yaml and jsonschema only: the workflow runs this while planning.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cs336_systems.core.edition import DEFAULT_EDITION, MODEL_SIZE_NAMES, edition_overrides
from cs336_systems.core.machine import Gpu, check_tag, tag_for

DASH = " — "
GLOBAL_KEYS = ("preset", "machine", "stages", "keep_raw", "compare", "edition")
# one block per preset in every stage: cpu (the whole pipeline on a CPU in minutes), gpu (every
# single-GPU question within its budget, docs/budgets.md), full (the handout's whole grid)
PRESETS = ("cpu", "gpu", "full")


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
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(Path(path).read_text(), Loader=loader)


# ---- facts every stage check may use -------------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """What the global keys and this machine say, for one preset block's checks."""

    preset: str  # the block's preset
    running: bool  # this block is the preset this run uses
    machine: str
    stages: tuple[str, ...]
    sizes: tuple[str, ...] = MODEL_SIZE_NAMES[DEFAULT_EDITION]
    edition: int = DEFAULT_EDITION
    # where knowable (the preset this run uses, run on this machine): MiB, None unknown
    host_memory_mib: float | None = None
    gpu_memory_mib: float | None = None
    gpus: int = 0


# ---- the checker stages use ----------------------------------------------------------------


@dataclass
class Checker:
    """Collects problems under a path (`at("launcher")` goes one key deeper)."""

    path: tuple = ()
    problems: list[Problem] = field(default_factory=list)

    def at(self, *keys) -> Checker:
        return Checker(self.path + keys, self.problems)

    def fail(self, key, value, allowed: str) -> None:
        """`key`: a key, an index, or a tuple of them (a nested key: ("launcher", "nnodes"))."""
        self.problems.append(Problem(self.path + _flat(key), value, allowed))

    def within(self, key, values: Iterable, sweep: Iterable, sweep_key: str) -> None:
        """Each of `values` (a filter) is a value of the sweep list `sweep_key`."""
        sweep = list(sweep)
        for i, v in enumerate(values):
            if v not in sweep:
                self.fail(
                    (key, i),
                    v,
                    f"a value of {key_path(self.path + (sweep_key,))} ({names(sweep)}): "
                    "a filter names only values the sweep runs",
                )

    def sizes(self, key: str, values: Iterable | str, facts: Facts) -> None:
        """Model size names of this run's model table (`facts.sizes`, the edition's)."""
        allowed = f"a model size of the {facts.edition} edition: one of {names(facts.sizes)}"
        if isinstance(values, str):
            if values not in facts.sizes:
                self.fail(key, values, allowed)
            return
        for i, v in enumerate(values):
            if v not in facts.sizes:
                self.fail((key, i), v, allowed)

    def at_most(self, lo_key: str, lo: float, hi_key: str, hi: float) -> None:
        if lo > hi:
            self.fail(lo_key, lo, f"at most {key_path(self.path + (hi_key,))} ({show(hi)})")

    def env(self, key: str, env: Mapping) -> None:
        """Environment variables the launcher can pass (`--env K=V,K=V`)."""
        for name, value in env.items():
            if not (name[:1].isalpha() or name[:1] == "_") or not all(
                c.isalnum() or c == "_" for c in name
            ):
                self.fail(
                    (key, name),
                    value,
                    "a variable name: letters, digits and '_', not a digit first",
                )
            text = str(value)
            if any(c in text for c in ",\n\r\0"):
                self.fail(
                    (key, name),
                    value,
                    "a value without ',' or line breaks (the launcher passes K=V,K=V)",
                )

    def fits(self, key, value, need_mib: float, have_mib: float | None, where: str) -> None:
        """A size whose buffers (`need_mib`) must fit in `have_mib` (None: not knowable)."""
        if have_mib is not None and need_mib > have_mib:
            self.fail(
                key,
                value,
                f"needs {need_mib:,.0f} MiB, more than the {have_mib:,.0f} MiB of {where}",
            )


def check_launcher(at: Checker, launcher: Mapping) -> None:
    """torchrun's topology: several nodes need `slurm` (`local` is one node's --standalone)."""
    if launcher["nnodes"] > 1 and launcher["topology"] != "slurm":
        at.fail(
            ("launcher", "nnodes"),
            launcher["nnodes"],
            "1 with topology local (one node); several nodes need topology slurm",
        )


def device_memory(facts: Facts) -> tuple[float | None, str]:
    """(MiB, where) of the device a single-process stage uses: the GPU if one is visible."""
    if facts.gpus:
        return facts.gpu_memory_mib, "the GPU"
    return facts.host_memory_mib, "this host"


def _flat(key) -> tuple:
    if not isinstance(key, tuple):
        return (key,)
    return tuple(k for part in key for k in _flat(part))


def head_dim_problem(d: int, largest: int) -> str | None:
    """Why the attention kernels (SDPA's flash/cuDNN/efficient backends, our FlashAttention-2)
    cannot take head dim `d`: they need a multiple of 8, up to `largest`."""
    if d % 8 or not 8 <= d <= largest:
        return f"a head dim the attention kernels take: a multiple of 8 from 8 to {largest}"
    return None


# ---- JSON schemas --------------------------------------------------------------------------


@dataclass
class Schema:
    """A JSON schema loaded once, with a validator whose integers are strict (2.0 is not one)."""

    schema: dict
    validator: Any = None

    @classmethod
    def load(cls, path: str | Path) -> Schema:
        import jsonschema

        schema = load_yaml(path)
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


# ---- the whole run -------------------------------------------------------------------------

StageCheck = Callable[[dict, Checker, Facts], None]


@dataclass
class Run:
    """What the workflow plans with: the resolved globals and every stage's checked block."""

    preset: str
    machine: str
    stages: list[str]
    notes: list[Problem]
    edition: int = DEFAULT_EDITION


def facts_for(
    preset: str,
    run_preset: str,
    machine: str,
    stages: list[str],
    gpus: list[Gpu],
    here: bool,
    host_memory_mib: float | None,
    edition: int = DEFAULT_EDITION,
) -> Facts:
    running = preset == run_preset
    knowable = running and here
    gpu_mem = [g.memory_mib for g in gpus if g.memory_mib]
    return Facts(
        preset=preset,
        running=running,
        machine=machine,
        stages=tuple(stages),
        sizes=MODEL_SIZE_NAMES[edition],
        edition=edition,
        host_memory_mib=host_memory_mib if knowable else None,
        gpu_memory_mib=min(gpu_mem) if knowable and gpu_mem else None,
        gpus=len(gpus) if knowable else 0,
    )


def check_run(
    config: dict,
    schemas: Mapping[str, Schema],
    stage_checks: Mapping[str, StageCheck | None],
    gpus: list[Gpu],
    host_memory_mib: float | None = None,
    command_line: Mapping | None = None,
) -> Run:
    """Check the merged config (global keys and every stage's block for every preset) and
    resolve preset, machine and stages; raise ConfigError listing every problem.

    `schemas` holds `config` (the global keys) and one schema per stage; `config` is changed in
    place where an integer was written as `2.0`, and where `command_line` (the `--config`
    values, nested ones arriving as text) gave text for a number, true/false or null."""
    text = text_paths(command_line or {})
    stage_names = sorted(k for k in schemas if k != "config")
    problems: list[Problem] = []
    notes: list[Problem] = []
    allowed = sorted([*GLOBAL_KEYS, *stage_names])
    for key in config:
        if key not in allowed:
            problems.append(Problem((key,), config[key], f"unknown key; allowed: {names(allowed)}"))
    top = {k: v for k, v in config.items() if k in GLOBAL_KEYS}
    found, top_notes = schema_problems(top, schemas["config"], text=text)
    problems += found
    notes += top_notes
    config.update(top)

    preset = config.get("preset")
    if preset == "auto":
        preset = "gpu" if gpus else "cpu"
    machine = config.get("machine")
    if machine == "auto":
        machine = tag_for([g.name for g in gpus])
    if isinstance(machine, str) and (why := check_tag(machine)):
        if not any(p.path == ("machine",) for p in problems):
            problems.append(Problem(("machine",), machine, why))
    stages = config.get("stages")
    if stages == "all":
        stages = stage_names
    elif isinstance(stages, list):
        for i, s in enumerate(stages):
            if isinstance(s, str) and s not in stage_names:
                problems.append(Problem(("stages", i), s, f"a stage: one of {names(stage_names)}"))
    # memory is knowable when the run is tagged as this host (planned here for a cluster
    # under another machine's tag, it is not)
    here = machine == tag_for([g.name for g in gpus])
    edition = DEFAULT_EDITION
    if not any(p.path == ("edition",) for p in problems):
        edition = int(config.get("edition", DEFAULT_EDITION))
    problems += [Problem(*p) for p in edition_overrides(config, stage_names, edition)]
    if problems:  # the stages' checks need valid globals
        raise ConfigError(problems + _stage_schema_problems(config, schemas, stage_names, text)[0])

    for stage in stage_names:
        block = config.get(stage, {})
        found, stage_notes = schema_problems(block, schemas[stage], (stage,), text)
        problems += found
        notes += stage_notes
        if isinstance(block, dict):
            for name in PRESETS:
                if name not in block:
                    problems.append(
                        Problem((stage, name), MISSING, f"every stage has a block for each "
                                f"preset ({names(list(PRESETS))})")
                    )  # fmt: skip
        check = stage_checks.get(stage)
        if check is None or not isinstance(block, dict):
            continue
        bad = {p.path[1] for p in found if len(p.path) > 1}
        for name, cfg in block.items():
            if name in bad or not isinstance(cfg, dict):
                continue
            facts = facts_for(name, preset, machine, stages, gpus, here, host_memory_mib, edition)
            check(cfg, Checker((stage, name), problems), facts)
    if problems:
        raise ConfigError(problems)
    return Run(preset=preset, machine=machine, stages=list(stages), notes=notes, edition=edition)


def start_problems(config: Mapping, preset: str, gpus: list[Gpu], cluster: bool) -> list[Problem]:
    """What stops a run from starting, checked when its first job is about to run (a dry run,
    `-n`, plans it anyway): on a cluster, a preset or machine left `auto` (the planning host
    cannot see the nodes' GPUs); here, a GPU preset on a machine without a GPU (it would
    measure the GPU grid on the CPU for hours, under this machine's results folder)."""
    if cluster:
        auto = [k for k in ("machine", "preset") if config.get(k) == "auto"]
        return [
            Problem(
                (key,),
                "auto",
                "on a cluster, name the preset and the machine (--config preset=gpu "
                "machine=<your GPU>): the host planning the run cannot see the nodes' GPUs",
            )
            for key in auto[:1]
        ]
    if preset != "cpu" and not gpus:
        return [
            Problem(
                ("preset",),
                preset,
                f"the {preset} preset measures on a GPU and this machine has none (no GPU in "
                "nvidia-smi or the driver, or CUDA_VISIBLE_DEVICES hides them): run "
                "--config preset=cpu here, plan it with -n, or submit it to a cluster "
                "(--profile profiles/slurm, docs/slurm.md)",
            )
        ]
    return []


def _stage_schema_problems(config, schemas, stage_names, text=frozenset()):
    problems, notes = [], []
    for stage in stage_names:
        found, more = schema_problems(config.get(stage, {}), schemas[stage], (stage,), text)
        problems += found
        notes += more
    return problems, notes


def merge(base: dict, override: Mapping) -> dict:
    """`override` merged into `base` (in place): mappings key by key, anything else replaced
    (as Snakemake merges --config and --configfile over the defaults)."""
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = value
    return base


def with_stage_defaults(config: dict, folder: str | Path) -> list[str]:
    """Merge each stage's defaults (`folder/<stage>.yaml`, one top-level key `<stage>`) under
    the user's config, in place; returns the stage names."""
    stages = []
    for path in sorted(Path(folder).glob("*.yaml")):
        defaults = load_yaml(path) or {}
        if set(defaults) != {path.stem}:
            raise ValueError(f"{path} must hold one top-level key '{path.stem}'")
        stages.append(path.stem)
        user = config.get(path.stem, {})
        if isinstance(user, Mapping):
            config[path.stem] = merge(defaults[path.stem], user)
    return stages


def load_schemas(folder: str | Path, stages: Iterable[str]) -> dict[str, Schema]:
    folder = Path(folder)
    out = {"config": Schema.load(folder / "config.schema.yaml")}
    for stage in stages:
        out[stage] = Schema.load(folder / f"{stage}.schema.yaml")
    return out
