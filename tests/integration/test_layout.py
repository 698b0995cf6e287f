"""The package's floors, its functions, its tests' tree and the workflow's code inputs: what the
tree promises a newcomer.

- three floors, as the pipeline runs: planning (workflow time, standard library only), then the
  measuring layers (model < core < kernels < parallel, profiling < engine < budget, adapters and
  the stages' measurements), then reporting (its helpers < the stages' answers < the report <
  the comparison); a module imports its own rank or lower, never upward, and no import circle;
- a stage's files sit on the floor of their role: `__init__` and `plan` on planning's, `rows`,
  `answers`, `figures`, `tables`, `analysis` and `aggregate` on reporting's, the rest (`measure`
  and what it uses) on the measuring floor; a stage never imports another stage;
- every rule's code inputs hold every package file its entry point imports (checked against
  Python's own record of the imports, `sys.modules` of the entry point run with `--help`, not
  against the workflow's derivation);
- a function fits on a screen (80 lines; Triton and Gluon kernel bodies excepted), and the tests
  mirror the code (unit/<layer>/, stages/<stage>/, integration/);
- what the workflow imports while planning (planning/, stage packages, plan modules) loads no
  torch, numpy or pandas.
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

from cs336_systems.planning.imports import stamp_files

PKG = ROOT / "src" / "cs336_systems"
# a stage file's floor by its role (its module name); any other stage file measures
PLANNING_ROLES = {"plan"}
REPORTING_ROLES = {"rows", "answers", "figures", "tables", "analysis", "aggregate"}
# rank of each top-level package or module; a module may import its own rank and lower ones
RANKS = {
    "planning": 0,  # floor 1: planning
    "model": 1,  # floor 2: measuring
    "models": 1,  # factories of models of one's own (docs/own-model.md)
    "core": 2,
    "kernels": 3,
    "parallel": 4,
    "profiling": 4,
    "engine": 5,
    "budget": 6,
    "adapters": 6,
    "stages": 6,  # a stage's measurement (by role: see stage_rank)
    "reporting": 7,  # floor 3: reporting, its helpers first
}
STAGE_ANSWERS = 8  # a stage's rows, answers and figures: above reporting's helpers
REPORTING_TOP = {"report": 9, "compare": 10}
FLOORS = {0: "planning", 1: "measuring", 2: "reporting"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SOURCES = sorted(PKG.rglob("*.py"))
MODULES = {module_name(p): p for p in SOURCES}


def rank(module: str) -> float:
    """The rank of a package module (see RANKS)."""
    parts = module.split(".")[1:]
    if not parts:
        return RANKS["planning"]  # the package itself: empty
    top = parts[0]
    if top == "stages":
        if len(parts) <= 2 or parts[2] in PLANNING_ROLES:
            return RANKS["planning"]  # the stage's package (its title) and its plan
        return STAGE_ANSWERS if parts[2] in REPORTING_ROLES else RANKS["stages"]
    if top == "reporting" and len(parts) > 1:
        return REPORTING_TOP.get(parts[1], RANKS["reporting"])
    return RANKS[top]


def floor(module: str) -> str:
    r = rank(module)
    return FLOORS[0 if r < 1 else 1 if r < RANKS["reporting"] else 2]


def package_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every cs336_systems module `path` imports, lazy imports included
    (`from a.b import c` names a.b.c where c is a module, else a.b)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                out.append((node.lineno, full if full in MODULES else node.module))
    return [(n, m) for n, m in out if m.startswith("cs336_systems.") and m in MODULES]


def stage_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[1] == "stages" and len(parts) > 2 else None


def test_every_module_is_on_a_floor():
    for name in MODULES:
        if name == "cs336_systems":
            continue
        assert name.split(".")[1] in RANKS, f"{MODULES[name]}: not in a layer {sorted(RANKS)}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PKG)))
def test_imports_go_down_the_floors(path):
    own = module_name(path)
    if own == "cs336_systems":
        return
    bad = []
    for line, imported in package_imports(path):
        if imported == "cs336_systems.stages":
            continue
        if stage_of(own) and stage_of(imported) and stage_of(own) != stage_of(imported):
            bad.append(f"line {line}: {imported} (another stage)")
        elif rank(imported) > rank(own):
            bad.append(
                f"line {line}: {imported} ({floor(imported)} floor, rank {rank(imported)}) is "
                f"above {own} ({floor(own)} floor, rank {rank(own)})"
            )
    assert not bad, f"{own} imports upward or sideways:\n" + "\n".join(bad)


def import_graph() -> dict[str, set[str]]:
    return {own: {m for _, m in package_imports(p)} - {own} for own, p in MODULES.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import graph's circles: its strongly connected components of more than one module
    (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    """Packages' `__init__` modules aside (a package imports its own modules' names), no module
    reaches itself through its imports, lazy ones included."""
    graph = {
        own: {m for m in deps if MODULES[m].name != "__init__.py"}
        for own, deps in import_graph().items()
    }
    assert not circles(graph)


def test_the_checks_catch_an_upward_a_sideways_and_a_circular_import(tmp_path):
    """The checker itself: a measuring module importing reporting, a stage importing another,
    and a circle are each reported."""
    assert rank("cs336_systems.reporting.sanity") > rank("cs336_systems.core.results")
    assert rank("cs336_systems.stages.benchmark.answers") > rank("cs336_systems.reporting.sanity")
    assert rank("cs336_systems.stages.benchmark.plan") < rank("cs336_systems.core.results")
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from cs336_systems.stages.benchmark.measure import run_grid\n")
    assert ("cs336_systems.stages.benchmark.measure") in [m for _, m in package_imports(probe)]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert not circles({"a": {"b"}, "b": set()})


def test_core_holds_at_most_twelve_files():
    assert len(list((PKG / "core").glob("*.py"))) <= 12


# --- functions fit on a screen ------------------------------------------------------------

# a function is at most this many lines, `def` to its last line (docstring included); Triton and
# Gluon kernel bodies (`@triton.jit`, `@gluon.jit`) are one compiled program each and exempt
MAX_FUNCTION_LINES = 80


def is_kernel(node: ast.FunctionDef) -> bool:
    """A Triton or Gluon kernel body: decorated `<x>.jit` or `<x>.jit(...)`."""
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Attribute) and target.attr == "jit":
            return True
    return False


def long_functions(paths) -> dict[str, int]:
    """{path:function: lines} of every function longer than MAX_FUNCTION_LINES."""
    out = {}
    for path in map(Path, paths):
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not is_kernel(node):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    out[f"{name}:{node.name}"] = lines
    return out


def test_no_function_is_longer_than_a_screen():
    assert not long_functions(SOURCES), long_functions(SOURCES)


def test_the_function_rule_finds_a_long_function_and_spares_a_kernel(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    probe = tmp_path / "probe.py"
    probe.write_text(f"def long():\n{body}\n\n@triton.jit\ndef kernel():\n{body}\n")
    assert long_functions([probe]) == {"probe.py:long": MAX_FUNCTION_LINES + 1}


# --- the tests mirror the code --------------------------------------------------------------

TESTS = ROOT / "tests"


def test_the_tests_mirror_the_code():
    """Every test file sits in unit/<layer>/ (a layer of the package), stages/<stage>/ (a stage)
    or integration/ (the workflow as a whole: pipeline, SLURM, README, layout)."""
    layers = {m.split(".")[1] for m in MODULES if m != "cs336_systems"}
    stages = {p.name for p in (PKG / "stages").iterdir() if (p / "__init__.py").exists()}
    misplaced = []
    for path in sorted(TESTS.rglob("test_*.py")):
        parts = path.relative_to(TESTS).parts
        if parts[0] == "tools":
            continue  # the sm_90 tools, run by tests, not tests themselves
        ok = (
            (len(parts) == 3 and parts[0] == "unit" and parts[1] in layers)
            or (len(parts) == 3 and parts[0] == "stages" and parts[1] in stages)
            or (len(parts) == 2 and parts[0] == "integration")
        )
        if not ok:
            misplaced.append(str(path.relative_to(ROOT)))
    assert not misplaced, misplaced
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert len(names) == len(set(names)), "two test files of one name (pytest imports by name)"


# --- the workflow's code inputs ---------------------------------------------------------------


@cache
def planned_jobs_with_inputs() -> list[tuple[str, list[str], str]]:
    """(rule, inputs, shell command) of every job of the default CPU run, from a forced dry run."""
    from pipeline_utils import snakemake

    proc = snakemake(ROOT, "-n", "-p", "--forceall", "report", timeout=600)
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


# Python's own record of an entry point's imports: one process loads the heavy third-party
# libraries once, then forks a child per entry module that runs it as `python -m module --help`
# would (runpy, argv) and reports the package modules in its sys.modules. The parent holds no
# package module, so a child's are exactly those its start imported (what `-X importtime` lists
# in a fresh process, without paying torch's import once per module).
IMPORT_PROBE = r"""
import json, os, runpy, sys, traceback

import matplotlib
matplotlib.use("Agg")
for lib in ("torch", "numpy", "pandas", "matplotlib.pyplot", "triton", "yaml"):
    try:
        __import__(lib)
    except ImportError:
        pass
ours = lambda: sorted(m for m in sys.modules if m.split(".")[0] == "cs336_systems")
assert not ours(), f"the probe imported package modules itself: {ours()}"
found = {}
for module in sys.argv[1:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: `python -m module --help`, its help text dropped
        os.close(r)
        result = {"error": None}
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            sys.argv = [module, "--help"]
            try:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            except SystemExit as e:
                if e.code not in (0, None):
                    result["error"] = f"exit status {e.code!r}"
        except BaseException:
            result["error"] = traceback.format_exc()
        result["modules"] = ours()
        with os.fdopen(w, "w") as f:
            json.dump(result, f)
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.read()
    os.waitpid(pid, 0)
    found[module] = json.loads(text) if text else {"error": "the child died", "modules": []}
print(json.dumps(found))
"""


@cache
def probed_imports(modules: tuple[str, ...]) -> dict[str, list[str]]:
    """{module: package modules Python loads to start `python -m module --help`}, one probe for
    all of them."""
    import json

    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE, *modules],
        cwd=ROOT,
        env=env_for(ROOT),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"the import probe failed:\n{proc.stderr[-3000:]}"
    found = json.loads(proc.stdout.splitlines()[-1])
    failed = {m: r["error"][-2000:] for m, r in found.items() if r["error"]}
    assert not failed, f"--help failed:\n{failed}\n{proc.stderr[-2000:]}"
    return {m: r["modules"] for m, r in found.items()}


def imported_files(module: str, names: list[str]) -> frozenset[str]:
    """The package files of the modules `names` that `module`'s start loaded, its own
    `__main__.py` included (a package run with -m)."""
    files = set()
    for name in [*names, module]:
        base = ROOT / "src" / Path(*name.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py", base / "__main__.py"):
            if candidate.is_file() and (candidate.name != "__main__.py" or name == module):
                files.add(str(candidate.relative_to(ROOT)))
    return frozenset(files)


# starts a measuring rule's stage on GPUs of its own (planning/claim.py): which card a job gets is
# not the job's code, and editing the allocator reruns no measurement
GPU_LAUNCHER = "cs336_systems.planning.claim"
# copies a job's output to its log (planning/tee.py): not the job's code either
LOG_TEE = "cs336_systems.planning.tee"


def entry_modules(shell: str) -> list[str]:
    found = re.findall(r"(?:python3?|\$PY) -m (cs336_systems[\w.]*)", shell)
    return [m for m in found if m not in (GPU_LAUNCHER, LOG_TEE)]


def test_every_rule_runs_a_package_entry_point():
    jobs = planned_jobs_with_inputs()
    assert len({rule for rule, _, _ in jobs}) >= 25, "expected every stage's rules in the plan"
    for rule, _, shell in jobs:
        assert entry_modules(shell), f"rule {rule} runs no `$PY -m cs336_systems...`"


def test_every_imported_file_is_an_input_of_its_rule():
    """For every rule: the files its entry point imports (as Python records them) are inputs;
    the report also imports the analysis of each stage it renders."""
    rules = []
    for rule, inputs, shell in planned_jobs_with_inputs():
        modules = entry_modules(shell)
        if rule == "report":
            stages = re.search(r"--stages (\S+)", shell).group(1).split(",")
            # (an analysis module's parents include the stage package, whose TITLE it reads)
            modules += [f"cs336_systems.stages.{s}.analysis" for s in stages]
        rules.append((rule, inputs, modules))
    probed = probed_imports(tuple(sorted({m for _, _, modules in rules for m in modules})))
    for module, names in probed.items():  # the probe saw each start load its own package
        assert module.rsplit(".", 1)[0] in names, (module, names)
    missing = {}
    for rule, inputs, modules in rules:
        needed = set().union(*(imported_files(m, probed[m]) for m in modules))
        # a code stamp (common.smk:code_stamp) stands for the files it lists
        stamps = [f for f in inputs if re.match(r"results/[^/]+/code/.+\.sha256$", f)]
        inputs = [*inputs, *(f for s in stamps for f in stamp_files(ROOT / s))]
        if lacking := sorted(needed - set(inputs)):
            missing[rule] = lacking
    assert not missing, missing


def test_planning_imports_load_no_torch_numpy_or_pandas():
    """The workflow imports planning/, stage packages (titles) and plan modules while planning:
    none of them may pull in torch, numpy or pandas (seconds on every dry run)."""
    planning = sorted(m for m in MODULES if floor(m) == "planning")
    assert any(m.endswith(".plan") for m in planning), "no stage has a plan module"
    code = (
        "import sys, importlib\n"
        f"for m in {planning!r}:\n"
        "    importlib.import_module(m)\n"
        "print(sorted(m for m in ('torch', 'numpy', 'pandas') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env_for(ROOT), capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
