"""The project's question list (reporting/questions.py, docs/questions.md): every part of both
handouts once, each answered by a stage or named as code with its tests, the readable list in
step with the code, and no file of the project pointing at a file the project lacks."""

from __future__ import annotations

import re

import pytest
from pipeline_utils import ROOT

from cs336_systems.reporting import coverage, questions, report


def test_the_readable_list_is_current():
    doc = ROOT / "docs" / "questions.md"
    assert doc.read_text() == questions.markdown(), (
        "docs/questions.md is stale: python -m cs336_systems.reporting.questions --out docs/questions.md"
    )


def test_parts_are_unique_and_well_formed():
    ids = [p["id"] for p in questions.PARTS]
    assert len(ids) == len(set(ids))
    for p in questions.PARTS:
        assert p["kind"] in questions.KINDS, p
        assert set(p["editions"]) <= set(questions.EDITIONS) and p["editions"], p
        assert p["deliverable"] and p["ask"], p
        assert p["problem"] in questions.SECTIONS, p
        if p["kind"] == "code":
            assert p["code"] and p["tests"], p
            for test in p["tests"].split(", "):
                assert (ROOT / test).exists(), (p["id"], test)
        else:
            assert p["answer"] in questions.ANSWERS, p


def test_stage_declarations_name_known_parts_and_evidence():
    declared = report.declared_questions()
    assert declared == questions.declarations()  # the literal read as data is what runs
    for stage, parts in declared.items():
        for pid, spec in parts.items():
            assert pid in questions.BY_ID, (stage, pid)
            assert spec["evidence"], (stage, pid)
            coverage._needs_gpus(spec.get("needs"))  # a known need


@pytest.mark.parametrize("edition", questions.EDITIONS)
def test_every_part_that_asks_for_an_answer_has_a_stage(edition):
    declared = questions.declarations()
    missing = [
        p["id"]
        for p in questions.edition_parts(edition)
        if p["kind"] != "code" and not questions.answered_by(p["id"], declared)
    ]
    assert not missing


def test_the_protocol_note():
    handout = {"benchmark": {"warmup_steps": [5], "measure_steps": [10]},
               "attention": {"fwd_steps": [100], "bwd_steps": [100]}}  # fmt: skip
    assert questions.protocol_note(handout, "gpu").startswith("This run follows the handout")
    cpu = {"benchmark": {"warmup_steps": [1], "measure_steps": [3]},
           "attention": {"fwd_steps": [5], "bwd_steps": [5]}}  # fmt: skip
    note = questions.protocol_note(cpu, "cpu")
    assert "1 warm-up step (benchmark) where the handout asks 5" in note
    assert "3 measured steps (benchmark) where the handout asks 10" in note
    assert "5 forward passes (attention) where the handout asks 100" in note
    assert "Why: the `cpu` preset is sized to run the whole study in minutes" in note
    assert questions.protocol_note({}, "gpu") == ""
    mixed = {"benchmark": {"warmup_steps": [1, 3], "measure_steps": [1]}}
    assert questions.protocol_deviations(mixed) == {
        "benchmark": "1/3 warm-up steps where the handout asks 5; 1 measured step where the"
        " handout asks 10"
    }


# -------------------------------------------------------- nothing points at a file it lacks

SCANNED = ["src", "workflow", "report/templates", "docs", "config", "scripts", "profiles",
           "tests", "README.md", "Snakefile", ".ci"]  # fmt: skip
# documentation named in text: a page under docs/, an upper-case page (README.md, DESIGN.md), or
# anything reached through `../` (outside the repository); report outputs (report/M/report.md,
# compare.md) are files a run writes, not references
MD = re.compile(
    r"(?<![\w<>/.-])((?:\.\./)+[\w.-]+(?:/[\w.-]+)*\.md|docs/[\w./-]+\.md|[A-Z][\w-]*\.md)(?![\w.])"
)


def _texts():
    for name in SCANNED:
        path = ROOT / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in files:
            if f.suffix in {".png", ".pdf", ".pt", ".pickle", ".gz", ".sqlite", ".nsys-rep"}:
                continue
            try:
                yield f, f.read_text()
            except UnicodeDecodeError:
                continue


def _exists(ref: str, where) -> bool:
    if ref.startswith("../"):
        return False  # outside the repository, or relative to a rendered report
    candidates = [ROOT / ref, where.parent / ref]
    # a bare name (budgets.md) or a report's name under a placeholder folder (report/M/report.md)
    return any(c.exists() for c in candidates) or any(ROOT.rglob(ref.split("/")[-1]))


def test_no_file_points_at_a_markdown_file_the_project_lacks():
    bad = []
    for f, text in _texts():
        if f.name == "test_questions.py":
            continue
        for ref in MD.findall(text):
            if not _exists(ref, f):
                bad.append(f"{f.relative_to(ROOT)}: {ref}")
    assert not bad, bad


def test_the_check_finds_a_missing_file():
    text = "QUESTIONS.md, ../shared/DESIGN.md, docs/budgets.md; compare.md.j2 writes out/c.md"
    assert MD.findall(text) == ["QUESTIONS.md", "../shared/DESIGN.md", "docs/budgets.md"]
    assert not _exists("QUESTIONS.md", ROOT / "src" / "x.py")
    assert not _exists("../shared/DESIGN.md", ROOT / "docs" / "x.md")
    assert _exists("docs/budgets.md", ROOT / "src" / "x.py")
