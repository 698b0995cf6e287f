"""Which stages of a committed reference changed since its commit: the README's table is what the
command writes, and the logic on a tiny git repository of two stages."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cs336_systems.reporting import staleness

ROOT = staleness.ROOT
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]


def test_the_reference_table_is_current():
    """report/reference/README.md holds what `staleness --write` writes: it fails when the table
    is out of date, not when a reference is stale."""
    if shutil.which("git") is None or staleness.git(ROOT, "rev-parse", "HEAD") is None:
        pytest.skip("not a git checkout: the table is computed from git history")
    verdicts = [staleness.verdict(staleness.read_reference(f)) for f in staleness.references()]
    missing = [f"{v.ref.folder}: {', '.join(v.missing)}" for v in verdicts if v.missing]
    if missing:
        pytest.skip(f"commits not in this clone's history (a shallow clone?): {missing}")
    committed = staleness.committed_table((ROOT / staleness.REFERENCE / "README.md").read_text())
    assert committed == staleness.table(verdicts).strip("\n"), (
        "report/reference/README.md's staleness table is out of date: run "
        "python -m cs336_systems.reporting.staleness --write"
    )


def test_every_reference_records_its_commit_and_stages():
    for folder in staleness.references():
        ref = staleness.read_reference(folder)
        assert ref.commits and ref.stages, ref


# ------------------------------------------------------------------- a tiny repository


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        Path(root, name).parent.mkdir(parents=True, exist_ok=True)
        Path(root, name).write_text(text)


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        [*GIT, *args], cwd=root, check=True, capture_output=True, text=True
    ).stdout


def _stage(name: str, title: str) -> dict[str, str]:
    pkg = f"src/cs336_systems/stages/{name}"
    return {
        f"{pkg}/__init__.py": f'TITLE = "{title}"\n',
        f"{pkg}/__main__.py": f"from cs336_systems.stages.{name} import measure\n",
        f"{pkg}/measure.py": "from cs336_systems import shared\n",
        f"{pkg}/plan.py": "KNOBS = None\n",
        f"{pkg}/analysis.py": "from cs336_systems.reporting import analysis\n",
        f"config/stages/{name}.yaml": f"{name}:\n  cpu: {{steps: 1}}\n",
        f"report/templates/sections/{name}.md.j2": "{{ s }}\n",
        f"workflow/rules/{name}.smk": (
            f'CODE = code_stamp(\n    "{name}", "cs336_systems.stages.{name}"\n)\n'
            f'rule x:\n    input: code=code_stamp("{name}_analysis", '
            f'"cs336_systems.stages.{name}.analysis")\n'
        ),
    }


@pytest.fixture
def repo(tmp_path) -> Path:
    """Two stages sharing one module; b's `files` knob names a test file; a reference of both,
    recording the first commit."""
    files = {
        "src/cs336_systems/__init__.py": "",
        "src/cs336_systems/shared.py": "X = 1\n",
        "src/cs336_systems/stages/__init__.py": "",
        "src/cs336_systems/reporting/__init__.py": "",
        "src/cs336_systems/reporting/analysis.py": "",
        "src/cs336_systems/reporting/report.py": "from cs336_systems.reporting import analysis\n",
        "report/templates/report.md.j2": "# {{ h }}\n",
        "tests/test_b.py": "def test_b(): pass\n",
        **_stage("a", "Stage A"),
        **_stage("b", "Stage B"),
    }
    files["config/stages/b.yaml"] = "b:\n  cpu: {files: [tests/test_b.py]}\n"
    # a's measurement also imports a module that is not there yet
    files["src/cs336_systems/stages/a/measure.py"] += "from cs336_systems import later\n"
    _write(tmp_path, files)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "first")
    sha = _git(tmp_path, "rev-parse", "HEAD").strip()
    _write(tmp_path, {"report/reference/x/report.md": _report(sha)})
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "the reference")
    return tmp_path


def _report(sha: str) -> str:
    return f"# T\n\n| | |\n|---|---|\n| git commit | `{sha[:12]}` |\n\n## Stage A\n\n## Stage B\n"


def _verdict(root: Path) -> staleness.Verdict:
    return staleness.verdict(staleness.read_reference(root / "report/reference/x", root), root)


def test_a_fresh_reference_is_current(repo):
    v = _verdict(repo)
    assert v.ref.stages == ("a", "b") and v.ref.frame == "report"
    assert v.current == ("a", "b", "report") and v.changed == {} and v.missing == ()


def test_a_change_to_one_stage_s_measurement_marks_that_stage_only(repo):
    _write(repo, {"src/cs336_systems/stages/a/measure.py": "from cs336_systems import shared\n"})
    _git(repo, "commit", "-q", "-am", "change a")
    v = _verdict(repo)
    assert v.changed == {"a": ("src/cs336_systems/stages/a/measure.py",)}
    assert v.current == ("b", "report")


def test_a_shared_module_marks_both_and_a_config_or_test_file_its_own(repo):
    _write(repo, {"src/cs336_systems/shared.py": "X = 2\n"})
    assert set(_verdict(repo).changed) == {"a", "b"}  # the tree, uncommitted change included
    _git(repo, "checkout", "-q", "--", ".")
    _write(repo, {"config/stages/b.yaml": "b:\n  cpu: {files: [tests/test_b.py], steps: 2}\n"})
    assert _verdict(repo).changed == {"b": ("config/stages/b.yaml",)}
    _git(repo, "checkout", "-q", "--", ".")
    _write(repo, {"tests/test_b.py": "def test_b(): assert True\n"})
    assert _verdict(repo).changed == {"b": ("tests/test_b.py",)}
    _git(repo, "checkout", "-q", "--", ".")
    _write(repo, {"report/templates/sections/b.md.j2": "{{ s.x }}\n"})
    assert _verdict(repo).changed == {"b": ("report/templates/sections/b.md.j2",)}


def test_a_new_untracked_module_a_stage_imports_is_a_change(repo):
    _write(repo, {"src/cs336_systems/later.py": ""})
    assert _verdict(repo).changed == {"a": ("src/cs336_systems/later.py",)}


def test_the_report_frame_is_its_own_row(repo):
    _write(repo, {"report/templates/report.md.j2": "# {{ h.x }}\n"})
    v = _verdict(repo)
    assert v.changed == {"report": ("report/templates/report.md.j2",)}
    assert "| `x/` | " in staleness.table([v]) and "report (1)" in staleness.table([v])


def test_a_commit_not_in_the_history_says_so(repo):
    _write(repo, {"report/reference/x/report.md": _report("0123456789abcdef")})
    v = _verdict(repo)
    assert v.missing == ("0123456789ab",) and v.changed == {}
    assert "not in this clone's history" in staleness.table([v])


def test_a_changed_file_is_listed_once_with_its_stages(repo):
    _write(repo, {"src/cs336_systems/shared.py": "X = 3\n"})
    text = staleness.table([_verdict(repo)])
    assert "| `src/cs336_systems/` | `shared.py` | a, b |" in text
    assert "a (1), b (1)" in text and "| – |" not in text.split("\n")[2]


def test_the_table_goes_between_the_markers():
    text = f"intro\n{staleness.BEGIN}\nold\n{staleness.END}\nafter\n"
    out = staleness.with_table(text, "new")
    assert out == f"intro\n{staleness.BEGIN}\nnew\n{staleness.END}\nafter\n"
    assert staleness.committed_table(out) == "new"
    with pytest.raises(ValueError):
        staleness.with_table("no markers", "new")


def test_a_comparison_records_its_machines_commits():
    text = (
        "| machine | git commit | preset |\n|---|---|---|\n"
        "| `cpu` | `490f82d60be2` | cpu |\n| `h100` | `490f82d60be2-dirty` | gpu |\n"
    )
    assert staleness.recorded_commits(text) == (("490f82d60be2",), "compare")
    assert staleness.recorded_commits("| git commit | `abcdef1234` (dirty tree) |\n") == (
        ("abcdef1234",),
        "report",
    )
