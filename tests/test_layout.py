"""The package's layers and the workflow's code inputs: what the tree promises a newcomer.

- imports go one way: model < core < kernels < parallel, profiling < engine < stages < adapters, report
  < compare;
  a stage never imports another stage;
- no file outside kernels/ is longer than 600 lines;
- every rule's code inputs hold every package file its entry point imports (checked against
  Python's own record of the imports, `-X importtime`, not against the workflow's derivation);
- what the workflow imports while planning (stage packages, plan modules) does not load torch.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from pipeline_utils import ROOT, env_for

from cs336_systems.core.imports import stamp_files

PKG = ROOT / "src" / "cs336_systems"
# rank of each layer: a module may import its own layer's modules and lower ranks only
LAYERS = {
    "model": 0,
    "core": 1,
    "kernels": 2,
    "parallel": 3,
    "profiling": 3,
    "engine": 3.5,  # builds on parallel/ (FSDP, DDP), below the stages
    "stages": 4,
    "adapters": 5,
    "report": 5,
    "budget": 5,
    "compare": 6,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every cs336_systems import in `path`, lazy ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return [(n, m) for n, m in out if m.startswith("cs336_systems.")]


def layer_of(module: str) -> str:
    return module.split(".")[1]


SOURCES = sorted(PKG.rglob("*.py"))


def test_every_module_is_in_a_layer():
    for path in SOURCES:
        name = module_name(path)
        if name == "cs336_systems":
            continue
        assert layer_of(name) in LAYERS, f"{path}: not in a layer {sorted(LAYERS)}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PKG)))
def test_imports_go_one_way(path):
    own = module_name(path)
    if own == "cs336_systems":
        return
    bad = []
    for line, imported in package_imports(path):
        if imported.count(".") < 1 or layer_of(imported) not in LAYERS:
            continue
        mine, theirs = layer_of(own), layer_of(imported)
        if mine == "stages" and theirs == "stages":
            # a stage's own modules only: never sideways into another stage
            if imported.split(".")[2:3] != own.split(".")[2:3]:
                bad.append(f"line {line}: {imported} (another stage)")
        elif theirs != mine and LAYERS[theirs] >= LAYERS[mine]:
            bad.append(f"line {line}: {imported} ({theirs} is not below {mine})")
    assert not bad, f"{own} imports upward or sideways:\n" + "\n".join(bad)


def test_the_rule_checks_catch_a_sideways_import(tmp_path):
    """The checker itself: a stage module importing another stage is reported."""
    fake = PKG / "stages" / "memory" / "measure.py"
    found = [m for _, m in package_imports(fake)]
    assert all(not m.startswith("cs336_systems.stages.benchmark") for m in found)
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from cs336_systems.stages.benchmark.measure import run_grid\n")
    assert ("cs336_systems.stages.benchmark.measure") in [m for _, m in package_imports(probe)]


def test_no_source_file_outside_kernels_is_longer_than_600_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in [*SOURCES, *ROOT.glob("scripts/**/*.py"), *ROOT.glob("benchmarks/*.py")]
        if "kernels" not in p.relative_to(ROOT).parts
        and (n := len(p.read_text().splitlines())) > 600
    }
    assert not long, long


# --- the workflow's code inputs ---------------------------------------------------------------


@cache
def planned_jobs_with_inputs() -> list[tuple[str, list[str], str]]:
    """(rule, inputs, shell command) of every job of the default CPU run, from a forced dry run."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "-p", "--forceall", "--cores", "1", "report"],
        cwd=ROOT,
        env=env_for(ROOT),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:\n)", proc.stdout):
        head = re.match(r"(?:local)?rule (\w+):\n", block)
        if not head:
            continue
        inputs = re.search(r"^\s+input: (.*)$", block, re.M)
        shell = re.search(r"^Shell command: (.*)$", block, re.M)
        jobs.append(
            (
                head.group(1),
                inputs.group(1).split(", ") if inputs else [],
                shell.group(1) if shell else "",
            )
        )
    return jobs


@cache
def runtime_imports(module: str) -> frozenset[str]:
    """Package files Python loads to start `python -m module --help` (its top-level imports)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", module, "--help"],
        cwd=ROOT,
        env=env_for(ROOT),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{module} --help failed:\n{proc.stderr[-2000:]}"
    names = re.findall(r"\|\s+(cs336_systems[\w.]*)\s*$", proc.stderr, re.M)
    files = set()
    for name in [*names, module]:
        base = ROOT / "src" / Path(*name.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py", base / "__main__.py"):
            if candidate.is_file() and (candidate.name != "__main__.py" or name == module):
                files.add(str(candidate.relative_to(ROOT)))
    return frozenset(files)


# starts a measuring rule's stage on GPUs of its own (core/gpus.py): which card a job gets is
# not the job's code, and editing the allocator reruns no measurement
GPU_LAUNCHER = "cs336_systems.core.gpus"


def entry_modules(shell: str) -> list[str]:
    found = re.findall(r"python3 -m (cs336_systems[\w.]*)", shell)
    return [m for m in found if m != GPU_LAUNCHER]


def test_every_rule_runs_a_package_entry_point():
    jobs = planned_jobs_with_inputs()
    assert len({rule for rule, _, _ in jobs}) >= 25, "expected every stage's rules in the plan"
    for rule, _, shell in jobs:
        assert entry_modules(shell), f"rule {rule} runs no `python3 -m cs336_systems...`"


def test_every_imported_file_is_an_input_of_its_rule():
    """For every rule: the files its entry point imports (as Python records them) are inputs;
    the report also imports the analysis of each stage it renders."""
    missing = {}
    for rule, inputs, shell in planned_jobs_with_inputs():
        modules = entry_modules(shell)
        if rule == "report":
            stages = re.search(r"--stages (\S+)", shell).group(1).split(",")
            # (an analysis module's parents include the stage package, whose TITLE it reads)
            modules += [f"cs336_systems.stages.{s}.analysis" for s in stages]
        needed = set().union(*(runtime_imports(m) for m in modules))
        # a code stamp (common.smk:code_stamp) stands for the files it lists
        stamps = [f for f in inputs if re.match(r"results/[^/]+/code/.+\.sha256$", f)]
        inputs = [*inputs, *(f for s in stamps for f in stamp_files(ROOT / s))]
        if lacking := sorted(needed - set(inputs)):
            missing[rule] = lacking
    assert not missing, missing


def test_planning_imports_do_not_load_torch():
    """The workflow imports stage packages (titles) and the import-graph reader while planning:
    none of them may pull in torch (seconds on every dry run)."""
    stages = sorted(p.name for p in (PKG / "stages").iterdir() if (p / "__init__.py").exists())
    plans = sorted(p.parent.name for p in (PKG / "stages").glob("*/plan.py"))
    assert plans, "no stage has a plan module"
    code = (
        "import sys, importlib\n"
        "import cs336_systems.core.imports\n"
        f"for s in {stages!r}:\n"
        "    importlib.import_module(f'cs336_systems.stages.{s}')\n"
        f"for s in {plans!r}:\n"
        "    importlib.import_module(f'cs336_systems.stages.{s}.plan')\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env_for(ROOT), capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
