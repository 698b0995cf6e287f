# The frame every stage plugs into: config validation, the preset, the machine tag, sweep
# tables and the helpers rules share.
import sys
from pathlib import Path

import pandas as pd
import yaml
from snakemake.utils import min_version, update_config, validate

ROOT = Path(workflow.basedir)
# the workflow's own package, whatever else is installed
sys.path.insert(0, str(ROOT / "src"))
from cs336_systems.core.imports import import_closure  # noqa: E402

min_version("9.0")
SCHEMAS = ROOT / "workflow" / "schemas"
GLOBAL_KEYS = {"preset", "machine", "stages", "keep_raw", "compare"}


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
        raise ConfigError(
            f"config/stages/{_stage}.yaml must hold one top-level key '{_stage}'"
        )
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
    from cs336_systems.core.results import machine_tag

    return machine_tag()


MACHINE = config["machine"] if config["machine"] != "auto" else _machine_tag()
RESULTS = f"results/{MACHINE}"
REPORT_DIR = f"report/{MACHINE}"

if config["stages"] == "all":
    STAGES = STAGE_NAMES
else:
    _bad = sorted(set(config["stages"]) - set(STAGE_NAMES))
    if _bad:
        raise ConfigError(
            f"config key 'stages': unknown stage(s) {_bad}; allowed: {STAGE_NAMES}"
        )
    STAGES = list(config["stages"])

# Each stage's rules file registers what the report needs from it: {stage: [files]}.
REPORT_INPUTS = {}


def stage_config(stage):
    """The validated settings of `stage` for the chosen preset."""
    block = config[stage]
    validate(block, str(SCHEMAS / f"{stage}.schema.yaml"))
    if PRESET not in block:
        raise ConfigError(
            f"config key '{stage}': no '{PRESET}' preset; have {sorted(block)}"
        )
    return block[PRESET]


def code(*modules, files=()):
    """A rule's code inputs: every package file that `modules` (what its shell runs with
    `python3 -m`) and the test `files` import, however deep, read from the import graph.
    """
    found = import_closure(ROOT / "src", *modules, files=[ROOT / f for f in files])
    return [str(p.relative_to(ROOT)) for p in found]


def common_args():
    """CLI arguments every stage takes: where its rows say they come from."""
    return f"--machine {MACHINE} --preset {PRESET}"


def cli_list(values):
    return ",".join(str(v) for v in values)


def parent(path):
    """The folder of a file: lets a rule hand a results or figures folder to its CLI."""
    return str(Path(path).parent)


print(
    f"[cs336] machine={MACHINE} preset={PRESET} stages={','.join(STAGES)}",
    file=sys.stderr,
)


def launcher_resources(stage):
    """SLURM resources of a distributed job from its launcher topology: over several nodes,
    the nodes, one task each, and `mpi` so the plugin runs the rule in the batch script,
    where the launcher's srun starts one torchrun per node."""
    if stage not in STAGES:
        return {}
    launcher = stage_config(stage)["launcher"]
    if launcher["topology"] != "slurm" or launcher["nnodes"] < 2:
        return {}
    return {"nodes": launcher["nnodes"], "tasks": launcher["nnodes"], "mpi": "srun"}


# the comparison report (workflow/rules/compare.smk)
def compare_folder(entry):
    """results/<tag>/ for a machine tag, the folder itself for a path."""
    return entry if len(Path(entry).parts) > 1 else f"results/{entry}"


def compare_inputs(wc):
    """This machine's report (so its run completes first) and the other folders' CSVs."""
    machines = config.get("compare", {}).get("machines", [])
    if len(machines) < 2:
        raise ConfigError(
            "config key 'compare.machines': name at least two machines or folders, baseline "
            "first, e.g. --config 'compare={machines: [cpu, h100-80gb-hbm3]}'"
        )
    files = []
    for entry in machines:
        if entry == MACHINE:
            files.append(f"{REPORT_DIR}/report.md")
            continue
        found = sorted(str(p) for p in Path(compare_folder(entry)).glob("*.csv"))
        if not found:
            raise ConfigError(
                f"config key 'compare.machines': no stage CSVs in {compare_folder(entry)}/"
            )
        files += found
    return files


onstart:
    if workflow.non_local_exec and "auto" in (config["preset"], config["machine"]):
        raise ConfigError(
            "on a cluster, name the preset and the machine (--config preset=gpu "
            "machine=<your GPU>): the host planning the run cannot see the nodes' GPUs"
        )
