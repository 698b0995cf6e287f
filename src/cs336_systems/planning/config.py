"""The run's configuration, checked once before any job: every problem is one line

    config: <stage>.<preset>.<key>[<index>]: <value> — <what is allowed>

and all of them are reported together (`ConfigError`). Three layers of checks:

1. the JSON schemas (a stage's `KNOBS` class, planning/knobs.py, or its
   `workflow/schemas/<stage>.schema.yaml`; `config.schema.yaml`): types,
   ranges, names, non-empty lists, duplicates, unknown keys. Their errors are translated into
   the line above (planning/schema.py: `schema_problems`); an integer written `2.0` is read as `2`
   and said so (a note), `2.5` is refused; so is command-line text meant as a number.
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

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cs336_systems.planning import machine, own_model
from cs336_systems.planning.edition import (
    DEFAULT_EDITION,
    MODEL_SIZE_NAMES,
    edition_overrides,
    edition_stages,
)
from cs336_systems.planning.machine import Gpu, check_tag, tag_for
from cs336_systems.planning.schema import (  # noqa: F401 (the names stages and the workflow use)
    DASH,
    MISSING,
    ConfigError,
    Problem,
    Schema,
    describe,
    key_path,
    load_yaml,
    names,
    schema_problems,
    show,
    text_paths,
)

GLOBAL_KEYS = ("preset", "machine", "stages", "keep_raw", "compare", "edition", own_model.KEY)
# one block per preset in every stage: cpu (the whole pipeline on a CPU in minutes), gpu (every
# single-GPU question within its budget, docs/budgets.md), full (the handout's whole grid)
PRESETS = ("cpu", "gpu", "full")


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
    """The launcher's topology: several nodes need `slurm` (`local` is one node)."""
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
    own: Mapping | None = None,
) -> Facts:
    """`own`: a model of one's own (planning/own_model.py), its name one more size."""
    running = preset == run_preset
    knowable = running and here
    gpu_mem = [g.memory_mib for g in gpus if g.memory_mib]
    return Facts(
        preset=preset,
        running=running,
        machine=machine,
        stages=tuple(stages),
        sizes=MODEL_SIZE_NAMES[edition] + ((own["name"],) if own else ()),
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
    edition = DEFAULT_EDITION
    if not any(p.path == ("edition",) for p in problems):
        edition = int(config.get("edition", DEFAULT_EDITION))
    stages = config.get("stages")
    if stages == "all":
        stages = edition_stages(stage_names, edition)
    elif isinstance(stages, list):
        for i, s in enumerate(stages):
            if isinstance(s, str) and s not in stage_names:
                problems.append(Problem(("stages", i), s, f"a stage: one of {names(stage_names)}"))
            elif isinstance(s, str) and s not in edition_stages([s], edition):
                notes.append(Problem(("stages", i), s, f"the {edition} handout asks nothing of "
                                     "this stage; it runs because the list names it"))  # fmt: skip
    # memory is knowable when the run is tagged as this host (planned here for a cluster
    # under another machine's tag, it is not)
    here = machine == tag_for([g.name for g in gpus])
    problems += [Problem(*p) for p in edition_overrides(config, stage_names, edition)]
    own = own_model.spec_of(config) if not problems else None  # one more size, its factory's
    problems += own_model_problems(own, edition) if own else []
    if problems:  # the stages' checks need valid globals
        raise ConfigError(problems + _stage_schema_problems(config, schemas, stage_names, text)[0])

    for stage in stage_names:
        block = config.get(stage, {})
        found, stage_notes = schema_problems(block, schemas[stage], (stage,), text)
        problems += found
        notes += stage_notes
        problems += _missing_presets(stage, block)
        check = stage_checks.get(stage)
        if check is None or not isinstance(block, dict):
            continue
        bad = {p.path[1] for p in found if len(p.path) > 1}
        for name, cfg in block.items():
            if name in bad or not isinstance(cfg, dict):
                continue
            facts = facts_for(
                name, preset, machine, stages, gpus, here, host_memory_mib, edition, own
            )
            check(cfg, Checker((stage, name), problems), facts)
    if problems:
        raise ConfigError(problems)
    return Run(preset=preset, machine=machine, stages=list(stages), notes=notes, edition=edition)


def _missing_presets(stage: str, block) -> list[Problem]:
    """A stage's block lacking a preset's block (none where the block is no mapping)."""
    allowed = f"every stage has a block for each preset ({names(list(PRESETS))})"
    missing = [p for p in PRESETS if p not in block] if isinstance(block, dict) else []
    return [Problem((stage, name), MISSING, allowed) for name in missing]


def own_model_problems(own: Mapping, edition: int) -> list[Problem]:
    """A model of one's own (planning/own_model.py): its name is not a course size's, its
    factories build a model with parameters."""
    taken = MODEL_SIZE_NAMES[edition]
    problems = []
    if own["name"] in taken:
        allowed = f"a name other than the sizes ({names(taken)})"
        problems.append(Problem((own_model.KEY, "name"), own["name"], allowed))
    return problems + [Problem(*p) for p in own_model.factory_problems(own)]


def torch_check_wanted(preset: str, gpus: list[Gpu]) -> bool:
    """Whether the start asks torch about the GPUs (start_problems): a GPU preset on a host
    whose driver shows GPUs, unless $CS336_GPU_CHECK=off (for GPUs a test fakes)."""
    checked = os.environ.get(machine.GPU_CHECK_ENV, "on").lower() not in ("off", "0", "no")
    return preset != "cpu" and bool(gpus) and checked


def start_problems(
    config: Mapping, preset: str, gpus: list[Gpu], cluster: bool, torch_probe=None
) -> list[Problem]:
    """What stops a run from starting, checked when its first job is about to run (a dry run,
    `-n`, plans it anyway): on a cluster, a preset or machine left `auto` (the planning host
    cannot see the nodes' GPUs); here, a GPU preset on a machine without a GPU (it would
    measure the GPU grid on the CPU for hours, under this machine's results folder), or with
    GPUs the environment's torch cannot use (`torch_probe`: machine.torch_cuda, asked in a
    process of its own: an old driver under a newer CUDA's wheel; $CS336_GPU_CHECK=off skips
    it, for GPUs a test fakes)."""
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
    # GPUs the driver shows: can torch use them? (a probe given is asked, the check on or off)
    if preset != "cpu" and (torch_probe or torch_check_wanted(preset, gpus)):
        found = (torch_probe or machine.torch_cuda)()
        if why := machine.unusable_gpu(found, machine.driver_version() if found else ""):
            return [Problem(("preset",), preset, why)]
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


def load_schemas(
    folder: str | Path, stages: Iterable[str], knobs: Mapping[str, type] | None = None
) -> dict[str, Schema]:
    """The global schema and each stage's: made from the stage's `KNOBS` class where its plan
    module declares one (`knobs`: {stage: class}, planning/knobs.py), else its schema file."""
    folder = Path(folder)
    out = {"config": Schema.load(folder / "config.schema.yaml")}
    for stage in stages:
        if knobs and knobs.get(stage) is not None:
            out[stage] = Schema.of(knobs[stage].schema(stage, PRESETS))
        else:
            out[stage] = Schema.load(folder / f"{stage}.schema.yaml")
    return out
