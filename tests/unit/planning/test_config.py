"""Every config value checked before any job (planning/config.py, the schemas, each stage's
plan.py:check), one category of bad input at a time, on the real defaults with one override.

Each problem is one line, `config: <stage>.<preset>.<key>[<index>]: <value> — <allowed>`.
The categories (docs/ARCHITECTURE.md lists them too):

 1. unknown key (global, stage, nested, preset)        10. min above max
 2. wrong type (string, list, mapping, bool for int)    11. machine tag not a short folder name
 3. an integer written 2.0 (read as 2, said) or 2.5     12. values the launcher cannot pass
 4. out of range                                        13. head dims / tiles the kernels refuse
 5. a name not allowed (preset, mode, model size, ...)  14. sizes that cannot fit this machine
 6. empty list                                          15. pytest expressions, regexes, files
 7. duplicates (sweep values, a stage listed twice)     16. launcher topology
 8. missing required key                                17. a timeout too short to run anything
 9. filters naming values outside the sweep             18. a block that is not a mapping
"""

from __future__ import annotations

import copy

import pandas as pd
import pytest
from config_checks import DEFAULTS, GB, check, one, problems, setup
from pipeline_utils import ROOT, block

from cs336_systems.planning import config as cfg
from cs336_systems.planning.machine import Gpu


def cpu(**block) -> dict:
    return {"cpu": block}


def test_the_defaults_pass_on_this_machine_and_a_gpu():
    run, _ = check({})
    assert (run.preset, run.machine) == ("cpu", "cpu")
    h100 = [Gpu("NVIDIA H100 80GB HBM3", "GPU-1", 81559.0)]
    run, _ = check({}, gpus=h100, host_memory_mib=64 * GB, preset="auto")
    assert (run.preset, run.machine) == ("gpu", "h100-80gb-hbm3")


CASES = {
    # 1. unknown keys, at every depth
    "unknown global": ({"presett": "gpu"}, "config: presett: 'gpu' — unknown key; allowed:"),
    "unknown stage key": (
        {"benchmark": cpu(colour="blue")},
        "config: benchmark.cpu.colour: 'blue' — unknown key; allowed: attention_only,",
    ),
    "unknown nested": (
        {"allreduce": cpu(launcher={"hosts": 2})},
        "config: allreduce.cpu.launcher.hosts: 2 — unknown key; allowed: nnodes, topology",
    ),
    "unknown preset": ({"memory": {"tpu": {}}}, "config: memory.tpu: {} — unknown key"),
    # 2. types
    "string for a list": (
        {"benchmark": cpu(context_lengths="128")},
        "config: benchmark.cpu.context_lengths: '128' — a non-empty list of integers >= 1",
    ),
    "string for an int": (
        {"benchmark": cpu(batch_size="4")},
        "config: benchmark.cpu.batch_size: '4' — an integer >= 1",
    ),
    "bool for an int": (
        {"attention": cpu(fwd_steps=True)},
        "config: attention.cpu.fwd_steps: true — an integer >= 1",
    ),
    "string for a bool": (
        {"attention": cpu(causal="yes")},
        "config: attention.cpu.causal: 'yes' — true or false",
    ),
    "list for a mapping": (
        {"ddp": cpu(env=["A=1"])},
        'config: ddp.cpu.env: ["A=1"] — a mapping (key: value)',
    ),
    # 3. a fractional number where an integer goes
    "2.5 for an int": (
        {"benchmark": cpu(measure_steps=2.5)},
        "config: benchmark.cpu.measure_steps: 2.5 — an integer >= 1",
    ),
    # 4. ranges
    "zero steps": (
        {"benchmark": cpu(measure_steps=0)},
        "config: benchmark.cpu.measure_steps: 0 — an integer >= 1",
    ),
    "negative warm-up": (
        {"benchmark": cpu(warmup_steps=-2)},
        "config: benchmark.cpu.warmup_steps: -2 — an integer >= 0",
    ),
    "exclusive minimum": (
        {"allreduce": cpu(sample_ms=0)},
        "config: allreduce.cpu.sample_ms: 0 — a number > 0",
    ),
    "context length 0 in a list": (
        {"benchmark": cpu(context_lengths=[16, 0])},
        "config: benchmark.cpu.context_lengths[1]: 0 — an integer >= 1",
    ),
    "above a maximum": (
        {"flash": cpu(head_dims=[16, 256])},
        "config: flash.cpu.head_dims[1]: 256 — an integer >= 1 and <= 128",
    ),
    # 5. names
    "preset": ({"preset": "tpu"}, "config: preset: 'tpu' — one of auto, cpu, gpu"),
    "mode": (
        {"memory": cpu(modes=["forward", "fwd"])},
        "config: memory.cpu.modes[1]: 'fwd' — one of inference, forward, forward_backward, train_step",
    ),
    "model size": (
        {"benchmark": cpu(sizes=["tiny", "huge"])},
        "config: benchmark.cpu.sizes[1]: 'huge' — a model size of the 2026 edition: one of "
        "tiny, small, medium,",
    ),
    "edition": (
        {"edition": 2024},
        "config: edition: 2024 — 2026 (the current course, the default) or 2025",
    ),
    "a 2025 size in the 2026 edition": (
        {"benchmark": cpu(sizes=["tiny", "2.7B"])},
        "config: benchmark.cpu.sizes[1]: '2.7B' — a model size of the 2026 edition: one of "
        "tiny, small, medium, large, xl, 10B",
    ),
    "an edition override for an unknown edition": (
        {"benchmark": cpu(editions={2024: {"sizes": ["tiny"]}})},
        'config: benchmark.cpu.editions[2024]: {"sizes": ["tiny"]} — a mapping of an '
        "edition (2026, 2025)",
    ),
    "ddp model size": ({"ddp": cpu(size="xxl")}, "config: ddp.cpu.size: 'xxl' — a model size"),
    "stage name": (
        {"stages": ["benchmark", "nope"]},
        "config: stages[1]: 'nope' — a stage: one of allreduce,",
    ),
    "mapping key": (
        {"flash": cpu(max_seq_len={"flash_trit": 64})},
        "config: flash.cpu.max_seq_len.flash_trit: 'flash_trit' — a key that is one of",
    ),
    "per-dtype cap key": (
        {"flash": cpu(max_seq_len={"flash_triton": {"fp64": 64}})},
        "config: flash.cpu.max_seq_len.flash_triton.fp64: 'fp64' — a key that is one of fp32,",
    ),
    # 6. empty lists
    "empty warm-up sizes": (
        {"benchmark": cpu(warmup_sweep={"sizes": []})},
        "config: benchmark.cpu.warmup_sweep.sizes: [] — a non-empty list",
    ),
    "empty variants": (
        {"ddp": cpu(variants=[])},
        "config: ddp.cpu.variants: [] — a non-empty list, each once, of: naive, flat,",
    ),
    "empty stages": ({"stages": []}, "config: stages: [] — a non-empty list of strings"),
    "empty compile filter": (
        {"benchmark": cpu(compile_only={"sizes": []})},
        "config: benchmark.cpu.compile_only.sizes: [] — a non-empty list",
    ),
    # 7. duplicates
    "stage twice": (
        {"stages": ["benchmark", "ceilings", "benchmark"]},
        "config: stages[2]: 'benchmark' — listed twice (also at [0]); each once",
    ),
    "duplicate warm-ups": (
        {"benchmark": cpu(warmup_sweep={"warmups": [0, 1, 1]})},
        "config: benchmark.cpu.warmup_sweep.warmups[2]: 1 — listed twice (also at [1])",
    ),
    "duplicate dtypes": (
        {"ceilings": cpu(dtypes=["fp32", "fp32"])},
        "config: ceilings.cpu.dtypes[1]: 'fp32' — listed twice (also at [0])",
    ),
    # 8. missing required keys (a block with no defaults)
    "missing key": (
        {
            "flash": cpu(
                leaderboard={
                    "impls": ["sdpa_flash"],
                    "dtype": "fp32",
                    "batch_size": 1,
                    "heads": 2,
                    "seq_len": 64,
                }
            )
        },
        "config: flash.cpu.leaderboard.head_dim: (missing) — required: an integer >= 1",
    ),
    # 9. filters name only values of the sweep
    "compile filter size": (
        {"benchmark": cpu(compile_only={"sizes": ["medium"]})},
        "config: benchmark.cpu.compile_only.sizes[0]: 'medium' — a value of "
        "benchmark.cpu.sizes (tiny, small): a filter names only values the sweep runs",
    ),
    "compile filter mode": (
        {"benchmark": cpu(modes=["forward"], compile_only={"modes": ["train_step"]})},
        "config: benchmark.cpu.compile_only.modes[0]: 'train_step' — a value of "
        "benchmark.cpu.modes (forward)",
    ),
    "attention filter": (
        {"benchmark": {"gpu": {"attention_only": {"context_lengths": [512, 777]}}}},
        "config: benchmark.gpu.attention_only.context_lengths[1]: 777 — a value of",
    ),
    # 10. min <= max
    "min repeats": (
        {"allreduce": cpu(min_repeats=20)},
        "config: allreduce.cpu.min_repeats: 20 — at most allreduce.cpu.repeats (10)",
    ),
    # 11. the machine tag
    "overlong tag": ({"machine": "m" * 65}, "config: machine: 'mmmm"),
    "tag with a slash": ({"machine": "a/b"}, "config: machine: 'a/b' — a short folder name"),
    "tag starting with a dot": ({"machine": ".."}, "config: machine: '..' — a short folder"),
    # 12. what the launcher can pass
    "env key with a comma": (
        {"allreduce": cpu(env={"A,B": 1})},
        "config: allreduce.cpu.env.A,B: 1 — a variable name: letters, digits and '_'",
    ),
    "env key with =": ({"ddp": cpu(env={"A=B": 1})}, "config: ddp.cpu.env.A=B: 1 — a variable"),
    "env key with a digit first": (
        {"ddp": cpu(env={"1A": 1})},
        "config: ddp.cpu.env.1A: 1 — a variable",
    ),
    "env value with a comma": (
        {"ddp": cpu(env={"NCCL_DEBUG": "INFO,WARN"})},
        "config: ddp.cpu.env.NCCL_DEBUG: 'INFO,WARN' — a value without ',' or line breaks",
    ),
    "fsdp env value with a comma": (
        {"fsdp": cpu(env={"NCCL_ALGO": "Ring,Tree"})},
        "config: fsdp.cpu.env.NCCL_ALGO: 'Ring,Tree' — a value without ','",
    ),
    "leaderboard stage heads": (
        {"leaderboard": cpu(num_heads=5)},
        "config: leaderboard.cpu.num_heads: 5 — a divisor of d_model (64)",
    ),
    "leaderboard stage head dim": (
        {"leaderboard": cpu(d_model=48, num_heads=12)},
        "config: leaderboard.cpu.num_heads: 12 — a head dimension d_model / num_heads",
    ),
    "leaderboard stage batch": (
        {"leaderboard": cpu(batch=3)},
        "config: leaderboard.cpu.batch: 3 — a multiple of world_size (2)",
    ),
    "leaderboard stage checkpoint": (
        {"leaderboard": cpu(checkpoint="every_0")},
        "config: leaderboard.cpu.checkpoint: 'every_0' — auto (by memory), none",
    ),
    "env value with a newline": (
        {"allreduce": cpu(env={"X": "a\nb"})},
        "config: allreduce.cpu.env.X: 'a\\nb' — a value without ','",
    ),
    "nsys path on two lines": (
        {"profile": cpu(nsys="/opt/nsys\n")},
        "config: profile.cpu.nsys: '/opt/nsys\\n' — a path on one line",
    ),
    # 13. shapes the kernels take
    "attention head dim 3": (
        {"attention": cpu(head_dims=[3, 16])},
        "config: attention.cpu.head_dims[0]: 3 — a head dim the attention kernels take: "
        "a multiple of 8 from 8 to 256",
    ),
    "flash head dim 12": (
        {"flash": cpu(head_dims=[12])},
        "config: flash.cpu.head_dims[0]: 12 — a head dim the attention kernels take",
    ),
    "leaderboard head dim": (
        {"flash": {"gpu": {"leaderboard": {"head_dim": 60}}}},
        "config: flash.gpu.leaderboard.head_dim: 60 — a head dim",
    ),
    "tile of 8": (
        {"flash": cpu(flash_pytorch_tiles=[8, 32])},
        "config: flash.cpu.flash_pytorch_tiles[0]: 8 — an integer >= 16",
    ),
    "three tiles": (
        {"flash": cpu(flash_pytorch_tiles=[32, 32, 32])},
        "config: flash.cpu.flash_pytorch_tiles: [32, 32, 32] — a list of exactly 2",
    ),
    # 15. pytest's own arguments, regexes, files
    "-k expression": (
        {"kernel_tests": cpu(select="not (fp16")},
        "config: kernel_tests.cpu.select: 'not (fp16' — a pytest -k expression; at column 10: "
        "expected right parenthesis",
    ),
    "-m expression": (
        {"kernel_tests": cpu(marker="gpu and")},
        "config: kernel_tests.cpu.marker: 'gpu and' — a pytest -m expression; at column 8",
    ),
    "kernel regex": (
        {"kernel_tests": cpu(kernels={"flash_pytorch": "^test_(pytorch"})},
        "config: kernel_tests.cpu.kernels.flash_pytorch: '^test_(pytorch' — a regular "
        "expression on test names; missing ), unterminated subpattern",
    ),
    "missing test file": (
        {"kernel_tests": cpu(files=["tests/test_nope.py"])},
        "config: kernel_tests.cpu.files[0]: 'tests/test_nope.py' — an existing test file",
    ),
    "test file outside tests/": (
        {"kernel_tests": cpu(files=["src/x.py"])},
        "config: kernel_tests.cpu.files[0]: 'src/x.py' — a test file tests/.../test_<name>.py",
    ),
    # 16. topology
    "two nodes, local": (
        {"allreduce": cpu(launcher={"nnodes": 2})},
        "config: allreduce.cpu.launcher.nnodes: 2 — 1 with topology local (one node); "
        "several nodes need topology slurm",
    ),
    "ranks per node": (
        {"ddp": cpu(world_size=3, launcher={"topology": "slurm", "nnodes": 2})},
        "config: ddp.cpu.world_size: 3 — a multiple of launcher.nnodes (2)",
    ),
    # 17. timeouts
    "test timeout 1 s": (
        {"kernel_tests": cpu(timeout_s=1)},
        "config: kernel_tests.cpu.timeout_s: 1 — an integer >= 60",
    ),
    # 18. a block that is not a mapping
    "stage block": ({"benchmark": {"cpu": 5}}, "config: benchmark.cpu: 5 — a mapping"),
}


@pytest.mark.parametrize("override,expected", CASES.values(), ids=CASES.keys())
def test_each_bad_value_is_one_line_naming_its_key(override, expected):
    line = one(override)
    assert line.startswith(expected), line
    assert "\n" not in line and "ValidationError" not in line and " — " in line


def test_an_integer_written_with_a_point_is_read_as_one_and_said():
    run, user = check({"benchmark": cpu(batch_size=2.0, warmup_sweep={"warmups": [0, 1.0]})})
    assert user["benchmark"]["cpu"]["batch_size"] == 2
    assert type(user["benchmark"]["cpu"]["batch_size"]) is int
    assert user["benchmark"]["cpu"]["warmup_sweep"]["warmups"] == [0, 1]
    notes = sorted(map(str, run.notes))
    assert notes == [
        "config: benchmark.cpu.batch_size: 2.0 — read as the integer 2",
        "config: benchmark.cpu.warmup_sweep.warmups[1]: 1.0 — read as the integer 1",
    ]


def test_every_problem_is_reported_at_once():
    found = problems(
        {
            "benchmark": cpu(measure_steps=0, sizes=["tiny", "tiny"]),
            "ddp": cpu(variants=[]),
            "allreduce": cpu(min_repeats=50),
        }
    )
    assert len(found) == 4, found
    assert all(line.startswith("config: ") for line in found)


def test_a_filter_that_selects_nothing_is_not_checked():
    # no compiled points: the defaults' compile filter (merged under any override) is inert
    check({"benchmark": cpu(compile=["eager"], context_lengths=[16], compile_only={})})
    check(
        {
            "benchmark": {
                "gpu": {"attentions": ["naive"], "compile": ["eager"], "context_lengths": [128]}
            }
        }
    )


def test_the_other_preset_is_checked_too():
    line = one({"benchmark": {"gpu": {"measure_steps": 0}}})
    assert line.startswith("config: benchmark.gpu.measure_steps: 0")


def test_every_preset_block_is_checked_and_full_runs_the_whole_grid():
    assert cfg.PRESETS == ("cpu", "gpu", "full")
    h100 = [Gpu("NVIDIA H100 80GB HBM3", "GPU-1", 81559.0)]
    run, user = check({}, gpus=h100, host_memory_mib=64 * GB, preset="full")
    assert run.preset == "full"
    # full is the handout's grid: it holds at least every point of gpu along each sweep axis
    for stage, axis in [("benchmark", "sizes"), ("benchmark", "context_lengths"),
                        ("flash", "seq_lens"), ("attention", "seq_lens")]:  # fmt: skip
        assert set(user[stage]["gpu"][axis]) <= set(user[stage]["full"][axis]), (stage, axis)
    line = one({"flash": {"full": {"head_dims": [12]}}})
    assert line.startswith("config: flash.full.head_dims[0]: 12")


def test_a_stage_without_a_block_for_each_preset_stops_the_run():
    stages, schemas, checks = setup()
    user = cfg.merge(copy.deepcopy(DEFAULTS), {"preset": "cpu", "machine": "auto"})
    cfg.with_stage_defaults(user, ROOT / "config" / "stages")
    del user["precision"]["full"]
    with pytest.raises(cfg.ConfigError) as err:
        cfg.check_run(user, schemas, checks, [])
    assert str(err.value).splitlines()[1:] == [
        "config: precision.full: (missing) — every stage has a block for each preset "
        "(cpu, gpu, full)"
    ]


# 14. sizes that cannot fit, where this machine is the one that runs them


def test_sizes_that_cannot_fit_this_host_stop_the_run():
    found = problems(
        {
            "ceilings": cpu(copy_mb=8192),
            "allreduce": cpu(sizes_mb={"gloo": [1, 2000]}),
        },
        host_memory_mib=8 * GB,
    )
    assert found == [
        "config: allreduce.cpu.sizes_mb.gloo[1]: 2000 — needs 12,000 MiB, more than the "
        "8,192 MiB of this host",
        "config: ceilings.cpu.copy_mb: 8192 — needs 16,384 MiB, more than the 8,192 MiB of "
        "this host",
    ]


def test_a_per_dtype_matmul_size_is_checked_under_its_own_key():
    line = one(
        {"ceilings": cpu(matmul_size=512, matmul_size_of={"fp32": 100_000})}, host_memory_mib=8 * GB
    )
    assert line.startswith("config: ceilings.cpu.matmul_size_of.fp32: 100000 — needs 114,441 MiB")
    assert problems({"ceilings": cpu(matmul_size_of={"fp64": 1024})})[0].startswith(
        "config: ceilings.cpu.matmul_size_of"
    )


def test_ceilings_measure_each_dtype_at_its_own_size(tmp_path):
    from cs336_systems.stages.ceilings import measure, plan

    own = {"matmul_size": 64, "matmul_size_of": {"fp32": 1024, "bf16": 64}, "dtypes": ["fp32"]}
    own = plan.CeilingsKnobs.from_block({**own, "copy_mb": 1, "reps": 2})
    assert plan.sizes_of(own) == {"fp32": [1024]}
    out = tmp_path / "ceilings.csv"
    knobs = block("ceilings", matmul_size=32, matmul_size_of={"fp32": 48}, extra_sizes={},
                  repeats=1, dtypes=["fp32", "bf16"], copy_mb=1, reps=2)  # fmt: skip
    measure.main(["--machine", "m", "--preset", "cpu", *knobs, "--out", str(out)])
    df = pd.read_csv(out)
    sizes = df[df["kind"] == "matmul"].set_index(["dtype", "path"])["size"]
    assert sizes.to_dict() == {("fp32", "matmul"): 48, ("bf16", "matmul"): 32,
                               ("bf16", "autocast_linear"): 32}  # fmt: skip


def test_gpu_sizes_are_checked_against_the_gpu():
    h100 = [Gpu("NVIDIA H100 80GB HBM3", "GPU-1", 81559.0)]
    line = one({"ceilings": {"gpu": {"matmul_size": 100_000}}}, gpus=h100, preset="auto")
    assert line.startswith("config: ceilings.gpu.matmul_size: 100000 — needs 114,441 MiB")
    assert line.endswith("of the GPU")


def test_memory_is_not_checked_for_another_machine_or_preset():
    huge = {"ceilings": {"cpu": {"copy_mb": 10**6}, "gpu": {"copy_mb": 10**6}}}
    # planned here for a cluster's GPU nodes: this host's memory says nothing
    check(huge, host_memory_mib=8 * GB, preset="gpu", machine="h100-80gb-hbm3")
    # the gpu block of a cpu run
    check({"ceilings": {"gpu": {"copy_mb": 10**6}}}, host_memory_mib=8 * GB)


def test_auto_machine_tag_is_checked_like_a_given_one():
    weird = [Gpu("NVIDIA " + "Very Long Model Name " * 5, "GPU-1")]
    run, _ = check({}, gpus=weird, preset="cpu")
    assert len(run.machine) <= 64 and run.machine.startswith("very-long-model-name")


def test_model_size_names_match_the_model():
    from cs336_systems import model
    from cs336_systems.planning import edition as ed

    assert ed.EDITIONS == model.EDITIONS and ed.DEFAULT_EDITION == model.DEFAULT_EDITION
    for edition in ed.EDITIONS:
        assert set(ed.MODEL_SIZE_NAMES[edition]) == set(model.size_names(edition))


def test_the_edition_picks_the_size_table_and_the_overrides():
    run, user = check({}, preset="gpu")
    assert run.edition == 2026
    assert user["benchmark"]["gpu"]["sizes"] == ["small", "medium", "large", "xl", "10B"]
    assert "editions" not in user["benchmark"]["gpu"]
    run, user = check({}, preset="gpu", edition=2025)
    assert run.edition == 2025
    assert user["benchmark"]["gpu"]["sizes"] == ["small", "medium", "large", "xl", "2.7B"]
    assert user["checkpointing"]["gpu"]["size"] == "2.7B"
    # written as a string (--config edition="2025"), read the same
    assert check({}, edition="2025")[0].edition == 2025
    # 10B is a 2026 name only; a 2.7B in a 2026 run is refused (above), a 10B in a 2025 one too
    line = one({"benchmark": cpu(sizes=["tiny", "10B"])}, edition=2025)
    assert line == (
        "config: benchmark.cpu.sizes[1]: '10B' — a model size of the 2025 edition: one of "
        "tiny, small, medium, large, xl, 2.7B"
    )


def test_kernel_limits_match_the_kernels():
    from cs336_systems.kernels.triton.common import MAX_HEAD_DIM
    from cs336_systems.stages.flash.plan import MAX_HEAD_DIM as PLANNED

    assert PLANNED == MAX_HEAD_DIM


def test_describe_and_key_paths():
    assert cfg.key_path(("benchmark", "cpu", "sizes", 2)) == "benchmark.cpu.sizes[2]"
    assert cfg.key_path(("stages", 0)) == "stages[0]"
    assert cfg.show("x" * 100).endswith("...") and len(cfg.show("x" * 100)) == 80
    schema = {
        "type": "array",
        "minItems": 1,
        "uniqueItems": True,
        "items": {"type": "integer", "minimum": 1},
    }
    assert cfg.describe(schema) == "a non-empty list of integers >= 1, each once"


def test_what_stops_a_run_from_starting():
    """planning/config.py:start_problems, checked by the workflow's onstart (not by a dry run)."""
    from cs336_systems.planning.config import start_problems

    h100 = [Gpu("NVIDIA H100 80GB HBM3", "GPU-1", 81559.0)]
    auto = {"preset": "auto", "machine": "auto"}
    named = {"preset": "gpu", "machine": "h100"}
    assert start_problems(named, "cpu", [], cluster=False) == []
    usable = {"available": True, "cuda": "13.0", "count": 1}
    assert start_problems(named, "gpu", h100, cluster=False, torch_probe=lambda: usable) == []
    (refused,) = start_problems(named, "gpu", [], cluster=False)
    assert str(refused).startswith("config: preset: 'gpu' — the gpu preset measures on a GPU")
    (full,) = start_problems({"preset": "full"}, "full", [], cluster=False)
    assert "the full preset" in str(full)
    # on a cluster the planning host's GPUs say nothing; `auto` cannot be resolved there
    assert start_problems(named, "gpu", [], cluster=True) == []
    (cluster,) = start_problems(auto, "cpu", [], cluster=True)
    assert str(cluster).startswith("config: machine: 'auto' — on a cluster, name the preset")


def test_a_gpu_torch_cannot_use_is_refused_with_its_cause(monkeypatch):
    """nvidia-smi shows a GPU, but the environment's torch cannot use it (an old driver under
    the cu130 wheel): refused before any job, naming the driver the wheel needs and the fix."""
    from cs336_systems.planning import machine
    from cs336_systems.planning.config import start_problems

    h100 = [Gpu("NVIDIA H100 80GB HBM3", "GPU-1", 81559.0)]
    monkeypatch.setattr(machine, "driver_version", lambda: "550.54.15")
    old = {"available": False, "cuda": "13.0", "count": 0}
    (refused,) = start_problems({}, "gpu", h100, cluster=False, torch_probe=lambda: old)
    text = str(refused)
    assert "torch.cuda.is_available() is false" in text
    assert "CUDA 13.0, which needs driver 580 or newer; this host's is 550.54.15" in text
    assert "docs/own-gpus.md" in text and "preset=cpu" in text
    # a driver new enough that still fails: no claim about the driver, the fact itself
    monkeypatch.setattr(machine, "driver_version", lambda: "580.159.04")
    (other,) = start_problems({}, "gpu", h100, cluster=False, torch_probe=lambda: old)
    assert "reports no usable GPU with driver 580.159.04" in str(other)
    # the probe is real where none is given: this machine's torch, in a process of its own
    assert set(machine.torch_cuda()) == {"available", "cuda", "count"}


def test_the_torch_probe_runs_beside_planning_and_is_waited_for_once_asked(tmp_path):
    """start_torch_cuda returns at once (the workflow starts it while the DAG is built); its
    answer waits for the process: the probe's JSON, or {} where torch fails to import."""
    import time

    from cs336_systems.planning import machine
    from cs336_systems.planning.config import torch_check_wanted

    slow = tmp_path / "python"
    slow.write_text(
        '#!/bin/sh\nsleep 1.5\necho \'{"available": true, "cuda": "13.0", "count": 4}\'\n'
    )
    slow.chmod(0o755)
    t0 = time.perf_counter()
    answer = machine.start_torch_cuda(str(slow))
    assert time.perf_counter() - t0 < 1.0
    assert answer() == {"available": True, "cuda": "13.0", "count": 4}
    assert time.perf_counter() - t0 >= 1.5
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho 'No module named torch' >&2\nexit 1\n")
    broken.chmod(0o755)
    assert machine.start_torch_cuda(str(broken))() == {}
    assert machine.start_torch_cuda(str(tmp_path / "absent"))() == {}
    # asked only for a GPU preset on a host whose driver shows GPUs, the check on
    h100 = [Gpu("NVIDIA H100 80GB HBM3", "GPU-1", 81559.0)]
    assert torch_check_wanted("gpu", h100) and not torch_check_wanted("cpu", h100)
    assert not torch_check_wanted("gpu", [])


def test_nested_command_line_values_arrive_as_text_and_are_read_as_numbers():
    """Snakemake reads a nested --config value with YAML's base loader, so that
    `benchmark={cpu: {context_lengths: [128]}}` arrives as ['128']: where the schema wants a
    number, true/false or null, command-line text is read as one, and said so. The same text
    in a config file (not command-line text) is still refused, and text that reads as no
    number is refused as before."""
    stages, schemas, checks = setup()
    line = {
        "benchmark": {"cpu": {"context_lengths": ["32", "64"], "max_point_s": "12.5"}},
        "fsdp": {"cpu": {"profile": "false"}},
        "profile": {"cpu": {"probe": {"start": "16"}}},
    }
    user = cfg.merge(copy.deepcopy(DEFAULTS), {"preset": "cpu", "machine": "auto"})
    user = cfg.merge(user, copy.deepcopy(line))
    cfg.with_stage_defaults(user, ROOT / "config" / "stages")
    run = cfg.check_run(user, schemas, checks, [], None, command_line=line)
    assert user["benchmark"]["cpu"]["context_lengths"] == [32, 64]
    assert user["benchmark"]["cpu"]["max_point_s"] == 12.5
    assert user["fsdp"]["cpu"]["profile"] is False
    assert user["profile"]["cpu"]["probe"]["start"] == 16
    notes = [str(n) for n in run.notes]
    assert (
        "config: benchmark.cpu.context_lengths[0]: '32' — text from the command line (--config), "
        "read as the integer 32" in notes
    )
    assert any("fsdp.cpu.profile: 'false'" in n and "the boolean false" in n for n in notes)
    # from a config file the same text is a wrong type
    found = problems({"benchmark": cpu(context_lengths=["32", "64"])})
    assert "config: benchmark.cpu.context_lengths[0]: '32' — an integer >= 1" in found
    # and text that is no number stays refused
    bad = {"benchmark": {"cpu": {"context_lengths": ["12x8"]}}}
    user = cfg.merge(copy.deepcopy(DEFAULTS), {"preset": "cpu", "machine": "auto", **bad})
    cfg.with_stage_defaults(user, ROOT / "config" / "stages")
    with pytest.raises(cfg.ConfigError, match=r"context_lengths\[0\]: '12x8' — an integer"):
        cfg.check_run(user, schemas, checks, [], None, command_line=bad)
