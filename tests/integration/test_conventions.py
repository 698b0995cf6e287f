"""docs/CONVENTIONS.md's two checklists, checked for every stage and every knob: each failure
names its step ("add a stage, step 3")."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from pathlib import Path

import pytest
import yaml
from pipeline_utils import ROOT

from cs336_systems.planning.config import Checker, Facts
from cs336_systems.planning.knobs import Knobs

PKG = ROOT / "src" / "cs336_systems"
STAGES = sorted(p.stem for p in (ROOT / "config" / "stages").glob("*.yaml"))
PRESETS = ["cpu", "gpu", "full"]


def defs(path: Path) -> set[str]:
    """The top-level names a module defines (functions, classes, assignments)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
    return out


def blocks(stage: str) -> dict:
    return yaml.safe_load((ROOT / "config" / "stages" / f"{stage}.yaml").read_text())[stage]


def plan(stage: str):
    return importlib.import_module(f"cs336_systems.stages.{stage}.plan")


def test_the_stages_are_the_config_files_and_the_folders():
    folders = sorted(p.name for p in (PKG / "stages").iterdir() if (p / "__init__.py").exists())
    assert folders == STAGES


@pytest.mark.parametrize("stage", STAGES)
def test_add_a_stage(stage):
    folder = PKG / "stages" / stage
    step = f"CONVENTIONS.md, add a stage ({stage}), step"
    data = yaml.safe_load((ROOT / "config" / "stages" / f"{stage}.yaml").read_text())
    assert list(data) == [stage] and sorted(data[stage]) == sorted(PRESETS), f"{step} 1"
    init = ast.parse((folder / "__init__.py").read_text())
    assert not [n for n in init.body if isinstance(n, ast.Import | ast.ImportFrom)], f"{step} 2"
    assert {"TITLE", "ORDER"} <= defs(folder / "__init__.py"), f"{step} 2"
    assert {"KNOBS", "estimate", "ETA_KEYS"} <= defs(folder / "plan.py"), f"{step} 3"
    assert issubclass(plan(stage).KNOBS, Knobs), f"{step} 3"
    assert "main" in defs(folder / "measure.py"), f"{step} 4"
    assert re.search(r"\bmain\(\)", (folder / "__main__.py").read_text()), f"{step} 4"
    assert {"plot", "context"} <= defs(folder / "analysis.py") | _imported(folder), f"{step} 5"
    rules = (ROOT / "workflow" / "rules" / f"{stage}.smk").read_text()
    assert f'stage_config("{stage}")' in rules, f"{step} 6: read the block once"
    assert f'REPORT_INPUTS["{stage}"]' in rules, f"{step} 6"
    assert (ROOT / "report" / "templates" / "sections" / f"{stage}.md.j2").is_file(), f"{step} 7"
    for item in report_items(stage, rules):
        assert (ROOT / "workflow" / "report" / stage / f"{item}.rst").is_file(), f"{step} 8: {item}"
    assert list((ROOT / "tests" / "stages" / stage).glob("test_*.py")), f"{step} 9"


def report_items(stage: str, rules: str) -> list[str]:
    """The names of the items the rules register in Snakemake's report: figures (a list literal,
    or a name the file assigns one to) and stage tables (their CSV's name)."""
    items = []
    for arg in re.findall(rf'(?<!vector_)figures\("{stage}", ([^)]*)\)', rules):
        if not arg.startswith("["):
            arg = re.search(rf"^{re.escape(arg)} = (\[.*?\])", rules, re.M | re.S).group(1)
        items += ast.literal_eval(arg)
    items += re.findall(rf'report_table\("{stage}", f"{{RESULTS}}/(\w+)\.csv"\)', rules)
    return items


def _imported(folder: Path) -> set[str]:
    """Names analysis.py imports from its stage's own modules (e.g. `plot` from figures.py)."""
    tree = ast.parse((folder / "analysis.py").read_text())
    return {
        a.asname or a.name
        for n in tree.body
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("cs336_systems.stages.")
        for a in n.names
    }


def stage_sources(stage: str) -> str:
    """The stage's code (its folder but the plan's declarations) and its rules file."""
    texts = [p.read_text() for p in (PKG / "stages" / stage).glob("*.py") if p.name != "plan.py"]
    plan_text = (PKG / "stages" / stage / "plan.py").read_text()
    # the plan's own functions read knobs too (estimate, helpers): its text after the knobs
    texts.append(plan_text.split("KNOBS =", 1)[-1])
    texts.append((ROOT / "workflow" / "rules" / f"{stage}.smk").read_text())
    return "\n".join(texts)


KNOB_CASES = [(stage, f.name) for stage in STAGES for f in dataclasses.fields(plan(stage).KNOBS)]


@pytest.mark.parametrize("stage,name", KNOB_CASES, ids=[f"{s}.{n}" for s, n in KNOB_CASES])
def test_add_a_knob(stage, name):
    step = f"CONVENTIONS.md, add a knob ({stage}.{name}), step"
    knobs = plan(stage).KNOBS
    field = next(f for f in dataclasses.fields(knobs) if f.name == name)
    assert field.metadata.get("doc"), f"{step} 1: a one-line doc"
    assert knobs.block_schema()["properties"][name].get("description"), f"{step} 1"
    for preset, block in blocks(stage).items():
        if field.default is dataclasses.MISSING:
            assert name in block, f"{step} 2: config/stages/{stage}.yaml {preset} lacks it"
    assert re.search(rf"\.{name}\b|\"{name}\"|'{name}'", stage_sources(stage)), (
        f"{step} 4: nothing reads it by its name"
    )


@pytest.mark.parametrize("stage", STAGES)
def test_every_default_block_passes_its_checks(stage):
    """Add a knob, step 3: the plan's `check` finds nothing wrong in a default block."""
    for preset, block in blocks(stage).items():
        knobs = plan(stage).KNOBS.from_block(block)  # every default block is its knobs
        assert knobs is not None
        if not hasattr(plan(stage), "check"):
            continue  # the schema says everything
        at = Checker((stage, preset))
        facts = Facts(preset=preset, running=False, machine="conventions", stages=tuple(STAGES))
        plan(stage).check(block, at, facts)
        assert not at.problems, f"CONVENTIONS.md, add a knob, step 3: {at.problems}"


def test_no_knob_is_copied_to_another_name():
    """Add a knob, step 4: no stage copies its block into argparse names."""
    copies = [p for p in (PKG / "stages").rglob("*.py") if "def with_knobs" in p.read_text()]
    assert not copies
