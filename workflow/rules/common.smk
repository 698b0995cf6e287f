# The frame every stage plugs into: config validation, the preset, the machine tag, sweep
# tables and the helpers rules share.
import itertools
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


def code(*modules, files=()):
    """A rule's code inputs: every package file that `modules` (what its shell runs with
    `python3 -m`) and the test `files` import, however deep, read from the import graph."""
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


print(f"[cs336] machine={MACHINE} preset={PRESET} stages={','.join(STAGES)}", file=sys.stderr)


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


onstart:
    if workflow.non_local_exec and "auto" in (config["preset"], config["machine"]):
        raise ConfigError(
            "on a cluster, name the preset and the machine (--config preset=gpu "
            "machine=<your GPU>): the host planning the run cannot see the nodes' GPUs"
        )


# Functions of individual stages (Snakemake's lint wants functions apart from rules): each stage
# keeps its own block below, headed by its name.

# --- benchmark ---


def benchmark_table():
    """One row per benchmark job (size, context length, attention); attentions other than the
    first run only where `attention_only` (if given) admits the size and context."""
    cfg = stage_config("benchmark")
    axes = {
        "size": cfg["sizes"],
        "context_length": cfg["context_lengths"],
        "attention": cfg["attentions"],
    }
    table = sweep_table("benchmark", axes, schema="benchmark_points")
    only = cfg.get("attention_only", {})
    keep = (
        (table["attention"] == cfg["attentions"][0])
        | (
            table["size"].isin(only.get("sizes", cfg["sizes"]))
            & table["context_length"].isin(only.get("context_lengths", cfg["context_lengths"]))
        )
    )
    return table[keep].reset_index(drop=True)


def benchmark_compile(wc):
    """eager everywhere; compiled only where `compile_only` (if given) admits the job."""
    cfg = stage_config("benchmark")
    only = cfg.get("compile_only", {})
    admitted = wc.size in only.get("sizes", [wc.size]) and int(wc.ctx) in only.get(
        "context_lengths", [int(wc.ctx)]
    )
    return cli_list(c for c in cfg["compile"] if c == "eager" or admitted)


def benchmark_compile_filter(key, all_key):
    """Within a job, the modes (or precisions) that get compiled points."""

    def pick(wc):
        cfg = stage_config("benchmark")
        return cli_list(cfg.get("compile_only", {}).get(key, cfg[all_key]))

    return pick

# --- kernel_tests ---


def kernel_tests_kernels(wc):
    """--kernel NAME=REGEX arguments, shell-quoted (the regexes hold | and ^)."""
    import shlex

    kernels = stage_config("kernel_tests")["kernels"]
    return " ".join(shlex.quote(f"--kernel={name}={regex}") for name, regex in kernels.items())


def kernel_tests_option(key):
    """A pytest selection option (-k / -m expression), shell-quoted; '' when unset."""

    def pick(wc):
        import shlex

        return shlex.quote(stage_config("kernel_tests")[key])

    return pick


# --- attention ---


def attention_points(wc):
    return expand(
        f"{RESULTS}/attention/points/{{impl}}.csv", impl=stage_config("attention")["impls"]
    )


# --- flash ---


def flash_gate(wc):
    """The kernel tests' CSV when that stage runs (it then gates our kernels), else nothing."""
    return [f"{RESULTS}/kernel_tests.csv"] if "kernel_tests" in STAGES else []


def flash_gate_arg(wc, input):
    return f"--kernel-tests {input.gate}" if input.gate else ""


def flash_options(wc):
    """The timing, cap and precision options every flash job shares."""
    cfg = stage_config("flash")
    timing = cfg["timing"]
    caps = cli_list(f"{k}={v}" for k, v in cfg["max_seq_len"].items())
    return (
        f"--max-seq-len '{caps}' --flash-tiles {cli_list(cfg['flash_pytorch_tiles'])}"
        f" --fp32-matmul-precision {cfg['fp32_matmul_precision']}"
        f" --warmup-ms {timing['warmup_ms']} --rep-ms {timing['rep_ms']}"
        f" --warmup-steps {timing['warmup_steps']} --steps {timing['steps']}"
    )


def flash_leaderboard_timing(wc):
    """The leaderboard point's own do_bench windows, where configured (they override)."""
    board = stage_config("flash")["leaderboard"]
    return " ".join(
        f"--{key.replace('_', '-')} {board[key]}"
        for key in ("warmup_ms", "rep_ms")
        if key in board
    )


def flash_point_files(wc):
    cfg = stage_config("flash")
    files = expand(f"{RESULTS}/flash/points/{{dtype}}.csv", dtype=cfg["dtypes"])
    return files + ([f"{RESULTS}/flash/leaderboard.csv"] if cfg.get("leaderboard") else [])
