# The frame every stage plugs into: config validation, the preset, the machine tag, sweep
# tables and the helpers rules share.
import itertools
import sys
from pathlib import Path

import pandas as pd
import yaml
from snakemake.utils import min_version, update_config, validate


min_version("9.0")

ROOT = Path(workflow.basedir)
PYTHON = sys.executable  # the interpreter running Snakemake runs every stage CLI
SCHEMAS = ROOT / "workflow" / "schemas"
GLOBAL_KEYS = {"preset", "machine", "stages", "keep_raw"}


class ConfigError(ValueError):
    """A configuration problem, reported before any job runs."""


def _load_stage_defaults():
    """Stage defaults from config/stages/*.yaml; the user's config (files, --config) wins."""
    stages = {}
    for path in sorted((ROOT / "config" / "stages").glob("*.yaml")):
        stages[path.stem] = yaml.safe_load(path.read_text()) or {}
    return stages


_STAGE_DEFAULTS = _load_stage_defaults()
STAGE_NAMES = sorted(_STAGE_DEFAULTS)

for _stage, _defaults in _STAGE_DEFAULTS.items():
    if set(_defaults) != {_stage}:
        raise ConfigError(f"config/stages/{_stage}.yaml must hold one top-level key '{_stage}'")
    _merged = yaml.safe_load(yaml.safe_dump(_defaults))  # deep copy
    update_config(_merged, {_stage: config.get(_stage, {})})
    config[_stage] = _merged[_stage]

_unknown = sorted(set(config) - GLOBAL_KEYS - set(STAGE_NAMES))
if _unknown:
    raise ConfigError(
        f"unknown config key(s) {_unknown}; allowed: {sorted(GLOBAL_KEYS | set(STAGE_NAMES))}"
    )
validate(config, str(SCHEMAS / "config.schema.yaml"))


def _cuda_visible():
    import torch

    return torch.cuda.is_available()


PRESET = config["preset"]
if PRESET == "auto":
    PRESET = "gpu" if _cuda_visible() else "cpu"


def _machine_tag():
    from cs336_systems.results import machine_tag

    return machine_tag()


MACHINE = config["machine"] if config["machine"] != "auto" else _machine_tag()
RESULTS = f"results/{MACHINE}"
REPORT_DIR = f"report/{MACHINE}"

if config["stages"] == "all":
    STAGES = STAGE_NAMES
else:
    _bad = sorted(set(config["stages"]) - set(STAGE_NAMES))
    if _bad:
        raise ConfigError(f"config key 'stages': unknown stage(s) {_bad}; allowed: {STAGE_NAMES}")
    STAGES = list(config["stages"])

# Each stage's rules file registers what the report needs from it: {stage: [files]}.
REPORT_INPUTS = {}


def stage_config(stage):
    """The validated settings of `stage` for the chosen preset."""
    block = config[stage]
    validate(block, str(SCHEMAS / f"{stage}.schema.yaml"))
    if PRESET not in block:
        raise ConfigError(f"config key '{stage}': no '{PRESET}' preset; have {sorted(block)}")
    return block[PRESET]


def sweep_table(stage, axes, schema=None):
    """The cartesian product of `axes` ({column: list}) as a DataFrame, one row per point,
    validated row by row against workflow/schemas/<schema>.schema.yaml when given."""
    names = list(axes)
    rows = [dict(zip(names, values)) for values in itertools.product(*(axes[n] for n in names))]
    table = pd.DataFrame(rows, columns=names)
    if schema is not None and len(table):
        validate(table, str(SCHEMAS / f"{schema}.schema.yaml"))
    return table


def sources(*modules):
    """The package source files a stage imports, as rule inputs: editing one reruns the stage."""
    files = ["results"] + list(modules)
    return [f"src/cs336_systems/{m.replace('.', '/')}.py" for m in dict.fromkeys(files)]


def common_args():
    """CLI arguments every stage takes: where its rows say they come from."""
    return f"--machine {MACHINE} --preset {PRESET}"


def cli_list(values):
    return ",".join(str(v) for v in values)


onstart:
    print(f"[cs336] machine={MACHINE} preset={PRESET} stages={','.join(STAGES)}", flush=True)
