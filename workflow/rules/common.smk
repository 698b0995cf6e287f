# The frame every stage plugs into: config validation, the preset, the machine tag, sweep
# tables and the helpers rules share.
import importlib
import os
import shlex
import sys
import time
from pathlib import Path

from snakemake.utils import min_version

ROOT = Path(workflow.basedir)
# The interpreter of every job: the one running Snakemake (its environment has the package
# and torch, activated or not), quoted; $CS336_PYTHON instead where set (a test's `python3` shim).
# The shell prefix below sets it as $PY, and $TEE: a job's output to its log and the console,
# as `tee`, a point's Python warnings and the tracebacks to the log alone (planning/tee.py;
# $CS336_LOG_ONLY marks them). Shell commands write `$PY -m ...` and `| $TEE {log}`.
PY = os.environ.get("CS336_PYTHON") or shlex.quote(sys.executable)
# the workflow's own package, whatever else is installed
sys.path.insert(0, str(ROOT / "src"))
from cs336_systems.planning import config as run_config  # noqa: E402
from cs336_systems.planning import machine as this_machine  # noqa: E402
from cs336_systems.planning import cores as host_cores  # noqa: E402
from cs336_systems.planning import imports  # noqa: E402
from cs336_systems.planning import own_model  # noqa: E402
from cs336_systems.planning.knobs import block_text  # noqa: E402

min_version("9.0")
SCHEMAS = ROOT / "workflow" / "schemas"
# what each package file imports, kept between runs (a rerun with nothing edited parses none)
imports.use_cache(Path(".snakemake", "cs336_imports.json"))
ConfigError = run_config.ConfigError


# each stage's defaults (config/stages/<stage>.yaml) under the user's --config/--configfile
STAGE_NAMES = run_config.with_stage_defaults(config, ROOT / "config" / "stages")
# a model of one's own (`own_model`): one more size of the stages that run any module
own_model.add_to_grids(config, STAGE_NAMES)


def _stage_plan(stage):
    """The stage's plan module (`stages/<stage>/plan.py`), if it has one."""
    name = f"cs336_systems.stages.{stage}.plan"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise


_PLANS = {stage: _stage_plan(stage) for stage in STAGE_NAMES}


# Every config value is checked here, once, before any job: the schemas, the global keys and
# each stage's own checks (stages/<stage>/plan.py:check); every problem is one line. A stage
# whose plan declares its knobs (`KNOBS`, planning/knobs.py) is checked against their schema.
_GPUS = this_machine.visible_gpus()
_RUN = run_config.check_run(
    config,
    run_config.load_schemas(
        SCHEMAS, STAGE_NAMES, {s: getattr(p, "KNOBS", None) for s, p in _PLANS.items()}
    ),
    {s: getattr(p, "check", None) for s, p in _PLANS.items()},
    gpus=_GPUS,
    host_memory_mib=this_machine.host_memory_mib(),
    # nested --config values arrive as text: '128' where a number is meant is read as 128
    command_line=workflow.config_settings.config,
)
for _note in _RUN.notes:
    print(_note, file=sys.stderr)
own_model.export(config)  # the jobs' copy of `own_model`
PRESET = _RUN.preset
MACHINE = _RUN.machine
# the start's question to torch (run_config.start_problems: can it use these GPUs?), asked now
# in a process of its own, so that its seconds of importing torch pass while the DAG is built
_TORCH_ANSWER = (
    this_machine.start_torch_cuda()
    if run_config.torch_check_wanted(PRESET, _GPUS)
    and not getattr(workflow.output_settings, "dryrun", False)
    and not (workflow.remote_exec or workflow.subprocess_exec)
    else None
)
STAGES = _RUN.stages
# the course's edition every stage answers (its model table and grids): 2026 or 2025
EDITION = _RUN.edition
RESULTS = f"results/{MACHINE}"
REPORT_DIR = f"report/{MACHINE}"

# One torch.compile / Inductor / Triton cache for the whole run, under the results folder: every
# job (and a rerun, or a second machine call with results/ carried back) reuses what an earlier
# job compiled, instead of each process starting from empty caches in /tmp. `$PWD` is the
# working directory when the job starts, so the results folder may be moved with its cache.
COMPILE_CACHE = f"{RESULTS}/.cache"

# The GPUs this run's jobs share: this host's visible ones (nvidia-smi indices). A job that
# measures on GPUs asks for the `gpu` resource (`gpus(n)`; the default profile provides the
# host's count, so Snakemake runs at most that many GPU jobs at once) and starts its stage
# through planning/claim.py, which gives it free cards of this pool of its own (CUDA_VISIBLE_DEVICES
# per job): under `--cores 4` on a 4-GPU host, four measurements at once, each alone on a card.
GPU_POOL = this_machine.gpu_indices(_GPUS)
# each card's memory (GiB, the smallest card's): the budget's estimates skip only what the
# host's cards cannot hold (a 141 GB H200 runs the 10B's forward, an 80 GB H100 does not)
GPU_GIB = min((g.memory_mib for g in _GPUS if g.memory_mib), default=0) / 1024 or None
# Jobs side by side: `gpu_jobs`, the GPU jobs at once (one a card while each card's job gets
# planning/cores.py's 2 cores of its own), and `timing`, which a job timed on the CPU holds
# alone (isolate_measuring_jobs below); --resources on the command line sets either
_CORES = len(host_cores.usable_cores())
_SLOTS = host_cores.gpu_slots(len(GPU_POOL), _CORES)
if "timing" not in workflow.global_resources:
    workflow.register_resource("timing", 1)
# `quiet`: a job timed on the CPU holds all of it, a light local job (aggregate, plot) one
# unit: the light jobs run beside each other and beside the GPU jobs, never beside a job timed
# on the CPU, with or without GPUs on the host (isolate_measuring_jobs below)
QUIET = 1000
if "quiet" not in workflow.global_resources:
    workflow.register_resource(
        "quiet", QUIET * max(1, int(workflow.global_resources["timing"].value or 1))
    )
# `card_cores`: on a GPU host the cards a job holds count against `--cores` here rather than as
# Snakemake's own cores: Snakemake selects no job at all while its cores are all taken, so an
# aggregate or plot (no core) that became ready while every core held a card waited for a GPU
# job to end
if GPU_POOL and "card_cores" not in workflow.global_resources:
    workflow.register_resource(
        "card_cores",
        int(workflow.global_resources["_cores"].value or 0) or len(GPU_POOL),
    )
if GPU_POOL and "gpu_jobs" not in workflow.global_resources:
    workflow.register_resource("gpu_jobs", _SLOTS)
    if _SLOTS < len(GPU_POOL):
        print(
            f"[cs336] {_CORES} CPU cores for {len(GPU_POOL)} GPUs: at most {_SLOTS} GPU "
            f"jobs at once, each with {host_cores.MIN_CORES_PER_GPU} cores of its own "
            "(`--resources gpu_jobs=N` to change)",
            file=sys.stderr,
        )


def gpus(n=1, only=None):
    """The `gpu` resource of a job measuring on `n` GPUs (`only(wildcards)`: whether this job
    uses GPUs at all, e.g. its backend is NCCL): at most this host's (a distributed stage writes
    `skipped` rows for the world sizes it lacks), 0 without GPUs. On a cluster 0: profiles/slurm
    asks SLURM for each rule's GPUs (`gpu`, or `gres` for distributed rules). Evaluated per job:
    Snakemake knows the executor then, not while it reads the rules."""

    def resource(wildcards):
        if workflow.non_local_exec or (only is not None and not only(wildcards)):
            return 0
        return min(n, len(GPU_POOL))

    return resource


# The run's estimate (written by onstart below) and each job's progress line after it: the
# time left (planning/eta.py).
ETA_DIR = f"{RESULTS}/eta"

# (the prefix replaces Snakemake's own, so it keeps `set -euo pipefail`: a failing stage piped
# through `tee` still fails its job, and prints no progress line after it)
shell.prefix(
    "set -euo pipefail; "
    f'PY={PY}; TEE="$PY -m cs336_systems.planning.tee"; '
    f'export TORCHINDUCTOR_CACHE_DIR="$PWD/{COMPILE_CACHE}/inductor"'
    f' TRITON_CACHE_DIR="$PWD/{COMPILE_CACHE}/triton"'
    f' CS336_GPU_POOL={",".join(map(str, GPU_POOL))} CS336_ETA="$PWD/{ETA_DIR}/eta.json"'
    # each measuring job's record of when it ran, on which cards and cores (planning/claim.py)
    f' CS336_JOB_RECORDS="$PWD/{RESULTS}/jobs/records" CS336_LOG_ONLY=1'
    # kineto's `gpuGetDeviceCount failed` lines on a machine without a GPU say nothing
    + ("" if GPU_POOL else ' KINETO_LOG_LEVEL="${{KINETO_LOG_LEVEL:-5}}"') + "; "
    # Snakemake exports a job's `threads` as OMP_NUM_THREADS and the like: 0 for the jobs that
    # take no core of its own here (a GPU job counts its cards instead, a light job runs beside
    # them), which OpenMP rejects with a warning; unset, the claim sizes them to the job's cores
    + '[ "${{OMP_NUM_THREADS:-}}" != 0 ] || unset OMP_NUM_THREADS GOTO_NUM_THREADS'
    + " OPENBLAS_NUM_THREADS MKL_NUM_THREADS VECLIB_MAXIMUM_THREADS NUMEXPR_NUM_THREADS; "
)
shell.suffix(f"; $PY -m cs336_systems.planning.eta")

# Each stage's rules file registers what the report needs from it: {stage: [files]}.
REPORT_INPUTS = {}


def stage_config(stage):
    """The typed knobs of `stage` for the chosen preset (its plan's `KNOBS`, checked above,
    once): rules read each knob by its declared name."""
    return _PLANS[stage].KNOBS.from_block(config[stage][PRESET])


def code(*modules, files=()):
    """A rule's code inputs: every package file that `modules` (what its shell runs with
    `$PY -m`) and the test `files` import, however deep, read from the import graph.
    """
    found = imports.import_closure(
        ROOT / "src", *modules, files=[ROOT / f for f in files]
    )
    imports.save_cache()
    return [str(p.relative_to(ROOT)) for p in found]


def code_stamp(name, *modules, files=(), extra=()):
    """One input standing for `code(*modules, files=files)` and the `extra` files (templates,
    declarations): `results/<machine>/code/<name>.sha256` lists them with their hashes and is
    rewritten, here while planning, only when one of them changed, so its mtime reruns the jobs
    exactly as the files' own would. Rules take their code so: a job's header names one file
    instead of every source file it imports, and Snakemake, which spends about a millisecond
    per input file and job, plans a sweep of thousands of points in seconds."""
    stamp = f"{RESULTS}/code/{name}.sha256"
    listed = [*code(*modules, files=files), *extra]
    imports.write_stamp(stamp, imports.digest(ROOT, listed))
    return stamp


def common_args():
    """CLI arguments every stage takes: where its rows say they come from, and the edition
    whose model table its size names resolve in."""
    return f"--machine {MACHINE} --preset {PRESET} --edition {EDITION}"


def cli_list(values):
    return ",".join(str(v) for v in values)


def parent(path):
    """The folder of a file: lets a rule hand a results or figures folder to its CLI."""
    return str(Path(path).parent)


# Snakemake's own report (`snakemake --report report.zip`, workflow/report/): each stage's
# figures and tables are items of it, one caption each (workflow/report/<stage>/<item>.rst),
# in a category per stage numbered in the report's order (the viewer sorts categories by name)
_STAGE_ORDER = sorted(
    STAGE_NAMES,
    key=lambda s: (
        getattr(importlib.import_module(f"cs336_systems.stages.{s}"), "ORDER", 999),
        s,
    ),
)
REPORT_CATEGORY = "00. The study: the whole report, one page"


def report_category(stage):
    title = importlib.import_module(f"cs336_systems.stages.{stage}").TITLE
    return f"{_STAGE_ORDER.index(stage) + 1:02d}. {title}"


def figures(stage, names):
    """The stage's figures (`report/<machine>/figures/<stage>_<name>.png`), each an item of
    Snakemake's report with its caption."""
    items = []
    for name in names:
        item = report(
            f"{REPORT_DIR}/figures/{stage}_{name}.png",
            caption=f"../report/{stage}/{name}.rst",
            category=report_category(stage),
            subcategory="figures",
            labels={"figure": name.replace("_", " ")},
        )
        items.append(item)
    return items


def vector_figures(stage, names):
    """The same figures as PDF, for a write-up (reporting/analysis.py:save writes both)."""
    return [f"{REPORT_DIR}/figures/{stage}_{name}.pdf" for name in names]


# every stage table's CSV (report_table) and its stage, for the page that shows it (table_page)
REPORT_TABLES = {}


def report_table(stage, path):
    """A stage's CSV (`results/<machine>/<name>.csv`) as an item of Snakemake's report, which
    offers it for download; its page (table_page) shows it."""
    name = Path(path).stem
    REPORT_TABLES[path] = stage
    item = report(
        path,
        caption=f"../report/{stage}/{name}.rst",
        category=report_category(stage),
        subcategory="tables",
        labels={"table": f"{name}.csv", "as": "CSV, to download"},
    )
    return item


def table_page(path):
    """The page of a stage's CSV (`path`, a report_table's), `results/<machine>/tables_html/
    <name>.html`, as an item of Snakemake's report beside the CSV: shown in the report's page,
    with the CSV's caption. Rule report writes it."""
    stage, name = REPORT_TABLES[path], Path(path).stem
    return report(
        f"{RESULTS}/tables_html/{name}.html",
        caption=f"../report/{stage}/{name}.rst",
        category=report_category(stage),
        subcategory="tables",
        labels={"table": f"{name}.csv", "as": "table, shown here"},
    )


print(
    f"[cs336] machine={MACHINE} preset={PRESET} edition={EDITION} stages={','.join(STAGES)}",
    file=sys.stderr,
)


# ---- jobs side by side (called by the Snakefile once every rules file is read) ---------------
# A measuring rule is one with a `gpu` resource. A job measuring on GPUs takes one `gpu_jobs`
# slot (the default profile: one a card while each card's job gets 2 cores, planning/cores.py)
# and counts its cards as its cores (`card_cores` where jobs run here, so that Snakemake's own
# cores stay free for the light jobs): its claim pins it to its cards' share of the host's cores,
# so a wide `threads` no longer keeps the other cards idle. A job timing on the CPU takes
# `timing` and every `gpu_jobs` slot: it runs alone among the measurements. Priorities come
# from the budget model (budget/forecast.py): a job on every card first, then jobs that gate
# others, then jobs on several cards, each tier by the largest GPU-seconds (seconds x cards),
# so that the longest and widest jobs do not come last. On a host with GPUs the light local
# jobs (aggregates, plots: seconds each) take no core (the GPU jobs' cards count as
# `card_cores`, so Snakemake's own cores are never all taken), so a stage's figures are drawn
# when it ends, not after the last measurement. On any host they take one unit of `quiet`,
# which a job timed on the CPU holds whole, so none runs beside such a job, and they run beside
# each other.


def _per_job(resource):
    """A rule's resource as a function of a job's wildcards (Snakemake keeps a declared value
    as a `Resource`: its function, or its plain value)."""
    if callable(resource):
        return resource
    evaluate = getattr(resource, "_evaluator", None)
    if evaluate is not None:
        return evaluate
    value = getattr(resource, "value", resource)
    return lambda wildcards: int(value or 0)


def global_resource(name):
    """The run's limit of a resource (the profile's or --resources'), 0 where none is set."""
    return int(workflow.global_resources.get(name).value or 0)


def _gpu_jobs(gpu):
    def resource(wildcards):
        if workflow.non_local_exec:
            return 0
        return 1 if gpu(wildcards) > 0 else global_resource("gpu_jobs")

    return resource


def _timing(gpu):
    return lambda wildcards: int(not workflow.non_local_exec and gpu(wildcards) == 0)


def _cores(gpu, threads):
    """A measuring job's cores: its cards (as `card_cores` where the light jobs run beside it),
    else its threads."""

    def cores(wildcards):
        cards = gpu(wildcards)
        return 0 if cards and _light_beside() else cards or threads(wildcards)

    return cores


def _card_cores(gpu):
    return lambda wildcards: gpu(wildcards) if _light_beside() else 0


def _light_beside():
    """Whether the light local jobs run beside the GPU jobs: a GPU host, jobs run here."""
    return bool(GPU_POOL) and not workflow.non_local_exec


def _light_cores(cores):
    return lambda wildcards: 0 if _light_beside() else cores(wildcards)


def _light_quiet(wildcards):
    return int(not workflow.non_local_exec)


def _quiet(gpu):
    """All of `quiet` for a job timed on the CPU (jobs run here), none otherwise: under
    `--cores 2` on two cores a plot beside a CPU-timed job slowed its steps up to 2x."""
    timing = _timing(gpu)
    return lambda wildcards: QUIET * timing(wildcards)


def _gates(rule, measuring):
    """Whether a measuring job waits for one of `rule`'s outputs (the kernel tests gate the
    flash jobs)."""
    wanted = [
        f for m in measuring if m is not rule for f in m.input if isinstance(f, str)
    ]
    return any(rule.is_producer(f) for f in wanted)


def isolate_measuring_jobs():
    from cs336_systems.budget import forecast

    measuring = [r for r in workflow.rules if "gpu" in r.resources.keys()]
    seconds = forecast.job_seconds(config, PRESET, len(GPU_POOL), GPU_GIB)
    for r in measuring:
        gpu = _per_job(r.resources["gpu"])
        r.resources["gpu_jobs"] = _gpu_jobs(gpu)
        r.resources["timing"] = _timing(gpu)
        r.resources["quiet"] = _quiet(gpu)
        r.resources["card_cores"] = _card_cores(gpu)
        r.resources["_cores"] = _cores(gpu, _per_job(r.resources["_cores"]))
        r.priority = forecast.priority(
            r.name, gpu, seconds, gates=_gates(r, measuring), cards=len(GPU_POOL)
        )
    for r in [r for r in workflow.rules if r not in measuring]:
        r.resources["_cores"] = _light_cores(_per_job(r.resources["_cores"]))
        r.resources["quiet"] = _light_quiet


def launcher_resources(stage):
    """SLURM resources of a distributed job from its launcher topology: over several nodes,
    the nodes, one task each, and `mpi` so the plugin runs the rule in the batch script,
    where the launcher's srun starts one torchrun per node."""
    if stage not in STAGES:
        return {}
    launcher = stage_config(stage).launcher
    if launcher.topology != "slurm" or launcher.nnodes < 2:
        return {}
    return {"nodes": launcher.nnodes, "tasks": launcher.nnodes, "mpi": "srun"}


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


def start_estimate():
    """The estimate of the jobs about to run, printed and written for their progress lines
    (planning/eta.py). It runs beside the first jobs: the budget reads every stage's plan.
    """
    import json
    import subprocess

    jobs = [
        {
            "rule": job.rule.name,
            "wildcards": dict(job.wildcards_dict),
            "outputs": [str(f) for f in job.output],
            "inputs": [str(f) for f in job.input],
            "gpus": int(job.resources.get("gpu", 0) or 0),
            "alone": bool(job.resources.get("timing", 0)),
            "light": int(job.resources.get("quiet", 0) or 0) == 1,
            "priority": job.priority,
        }
        for job in workflow.dag.needrun_jobs()
        if job.rule.name != "all"
    ]
    folder = Path(ETA_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    Path(folder, "eta.json").unlink(missing_ok=True)  # a past run's
    Path(folder, "jobs.json").write_text(json.dumps(jobs))
    Path(folder, "config.json").write_text(json.dumps(config, default=str))
    if workflow.non_local_exec:
        parallel, cards = workflow.nodes or 1, 0
    else:
        parallel = min(workflow.cores or 1, os.cpu_count() or 1)
        cards = min(len(GPU_POOL), global_resource("gpu_jobs"))
    subprocess.Popen(
        [
            sys.executable, "-m", "cs336_systems.budget.forecast",
            "--jobs", f"{folder}/jobs.json", "--config", f"{folder}/config.json",
            "--out", f"{folder}/eta.json", "--preset", PRESET,
            "--parallel", str(parallel), "--cards", str(cards), "--start", str(time.time()),
            *(["--memory-gib", str(GPU_GIB)] if GPU_GIB else []),
        ],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        },
    )  # fmt: skip


onstart:
    # before the first job, not while planning: `-n` plans any preset anywhere
    if _problems := run_config.start_problems(
        config, PRESET, _GPUS, workflow.non_local_exec, _TORCH_ANSWER
    ):
        raise ConfigError(_problems)
    if workflow.non_local_exec and "gpu" in workflow.global_resources:
        # the default profile's count is this host's GPUs, not the cluster's: SLURM decides
        workflow.register_resource("gpu", sys.maxsize)
    start_estimate()
