"""Which stages of a committed report changed since the commit that ran it, computed from git.

    python -m cs336_systems.reporting.staleness [FOLDER ...] [--write]

A FOLDER holds a report.md (default: every folder under report/reference/). The commit is the
one its header records (`| git commit | ... |`; a comparison: its table's `git commit` column),
and the stages are those with a section in it. A stage's files are

- its code: every package file the modules its rules' code stamps name import, however deep
  (`code_stamp(...)` in workflow/rules/<stage>.smk, walked by planning/imports.py, the
  workflow's own walker), and the test files its `files` knob names (the kernel tests);
- its config: config/stages/<stage>.yaml (its values) and its plan.py (its knobs' declaration);
- its section's template: report/templates/sections/<stage>.md.j2.

The report's frame (`report`: reporting/report.py's imports and report.md.j2; a comparison's:
`compare`) counts as one more stage. A stage is `current` when none of its files differs between
the commit and the checked-out tree (`git diff --name-only <commit> -- <files>`, untracked files
counted as changed): in a clean checkout that is HEAD, and the table names no commit after the
reference's, so the commit that writes it does not change it. `--write` puts the table in
report/reference/README.md between its marker comments; tests/unit/reporting/test_staleness.py
fails when that table differs from what this writes.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from cs336_systems.planning.imports import import_closure, module_literal
from cs336_systems.planning.log import configure, get_logger
from cs336_systems.planning.schema import load_yaml

log = get_logger(__name__)

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = Path("report", "reference")
BEGIN = "<!-- staleness: begin (python -m cs336_systems.reporting.staleness --write) -->"
END = "<!-- staleness: end -->"
FRAMES = {"report": "cs336_systems.reporting.report", "compare": "cs336_systems.reporting.compare"}
_HEADER_COMMIT = re.compile(r"^\| git commit \| (.*) \|\s*$", re.M)
_SHA = re.compile(r"`([0-9a-f]{7,40})(?:-dirty)?`")


@dataclass(frozen=True)
class Reference:
    """A report folder: the commits that ran it, the stages it shows and its frame."""

    folder: str
    commits: tuple[str, ...]
    stages: tuple[str, ...]
    frame: str


@dataclass(frozen=True)
class Verdict:
    """A reference against the tree: `missing` commits are not in this clone's history;
    `changed` maps each stage (or frame) with a changed file to those files."""

    ref: Reference
    missing: tuple[str, ...]
    current: tuple[str, ...]
    changed: dict[str, tuple[str, ...]]


def stage_names(root: Path = ROOT) -> list[str]:
    """The stages, as the workflow finds them: one config/stages/<stage>.yaml each."""
    return sorted(p.stem for p in Path(root, "config", "stages").glob("*.yaml"))


def titles(root: Path = ROOT) -> dict[str, str]:
    """{section heading: stage}, from each stage package's TITLE (read, not imported)."""
    src = Path(root, "src")
    return {module_literal(src, f"cs336_systems.stages.{s}", "TITLE"): s for s in stage_names(root)}


def recorded_commits(text: str) -> tuple[tuple[str, ...], str]:
    """(commits, frame) a report records: its header's git commit row, or the `git commit`
    column of a comparison's table of machines."""
    row = _HEADER_COMMIT.search(text)
    if row:
        return tuple(dict.fromkeys(_SHA.findall(row.group(1)))), "report"
    for table in re.finditer(r"^(\|.*\|)\n\|[-:| ]+\|\n((?:\|.*\|\n?)+)", text, re.M):
        columns = [c.strip() for c in table.group(1).strip("|").split("|")]
        if "git commit" in columns:
            at = columns.index("git commit")
            cells = [r.strip().strip("|").split("|")[at] for r in table.group(2).splitlines()]
            return tuple(dict.fromkeys(c for cell in cells for c in _SHA.findall(cell))), "compare"
    return (), "report"


def read_reference(folder: Path, root: Path = ROOT) -> Reference:
    """The reference in `folder`, from its report.md: commits, shown stages, frame."""
    text = Path(folder, "report.md").read_text()
    commits, frame = recorded_commits(text)
    by_title = titles(root)
    headings = re.findall(r"^## (.+?)\s*$", text, re.M)
    stages = tuple(dict.fromkeys(by_title[h] for h in headings if h in by_title))
    name = Path(folder).resolve()
    try:
        label = str(name.relative_to(Path(root).resolve() / REFERENCE))
    except ValueError:
        label = str(folder)
    return Reference(label, commits, stages, frame)


def rule_modules(root: Path, stage: str) -> list[str]:
    """The modules the code stamps of the stage's rules name (`code_stamp(name, module, ...)`
    in workflow/rules/<stage>.smk): what the workflow walks for its jobs' code inputs."""
    path = Path(root, "workflow", "rules", f"{stage}.smk")
    text = path.read_text() if path.is_file() else ""
    found: list[str] = []
    for start in re.finditer(r"\bcode_stamp\(", text):
        depth, end = 1, start.end()
        while depth and end < len(text):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        found += re.findall(r"\"(cs336_systems(?:\.\w+)*)\"", text[start.end() : end])
    return list(dict.fromkeys(found))


def stage_files(stage: str, root: Path = ROOT) -> list[str]:
    """The files whose change may change what the stage's section shows (see the module's doc)."""
    root = Path(root)
    config = Path("config", "stages", f"{stage}.yaml")
    blocks = (load_yaml(root / config) or {}).get(stage) or {}
    tests = sorted(
        {f for b in blocks.values() if isinstance(b, dict) for f in b.get("files") or []}
    )
    code = import_closure(root / "src", *rule_modules(root, stage), files=[root / f for f in tests])
    listed = {str(p.relative_to(root)) for p in code} | set(tests) | {str(config)}
    listed.add(str(Path("report", "templates", "sections", f"{stage}.md.j2")))
    listed.add(str(Path("src", "cs336_systems", "stages", stage, "plan.py")))
    return sorted(f for f in listed if (root / f).is_file())


def frame_files(frame: str, root: Path = ROOT) -> list[str]:
    """The report's (or the comparison's) own files: its module's imports and its template."""
    root = Path(root)
    code = [str(p.relative_to(root)) for p in import_closure(root / "src", FRAMES[frame])]
    return sorted([*code, str(Path("report", "templates", f"{frame}.md.j2"))])


def git(root: Path, *args: str) -> str | None:
    """stdout of `git args` in `root`, or None when git fails (or is missing)."""
    try:
        out = subprocess.run(
            ["git", "-c", "core.quotepath=off", *args], cwd=root, capture_output=True, text=True
        )
    except OSError:
        return None
    return out.stdout if out.returncode == 0 else None


def has_commit(root: Path, commit: str) -> bool:
    return git(root, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}") is not None


def changed_files(root: Path, commit: str, files: list[str]) -> set[str]:
    """Of `files`, those the checked-out tree holds otherwise than `commit` (untracked: new)."""
    diff = git(root, "diff", "--name-only", commit, "--", *files) or ""
    new = git(root, "ls-files", "--others", "--exclude-standard", "--", *files) or ""
    return set(diff.split()) | set(new.split())


def verdict(ref: Reference, root: Path = ROOT) -> Verdict:
    """Each shown stage (and the frame) current or changed since the reference's commits."""
    root = Path(root)
    missing = tuple(c for c in ref.commits if not has_commit(root, c))
    groups = {s: stage_files(s, root) for s in ref.stages}
    groups[ref.frame] = frame_files(ref.frame, root)
    every = sorted({f for files in groups.values() for f in files})
    changed_any: set[str] = set()
    for commit in ref.commits:
        if commit not in missing:
            changed_any |= changed_files(root, commit, every)
    changed = {s: tuple(f for f in files if f in changed_any) for s, files in groups.items()}
    changed = {s: files for s, files in changed.items() if files}
    current = tuple(s for s in groups if s not in changed)
    return Verdict(ref, missing, current, changed)


def references(root: Path = ROOT) -> list[Path]:
    """The committed reference folders: each with a report.md, by name."""
    return sorted(p.parent for p in Path(root, REFERENCE).glob("*/report.md"))


def _names(items) -> str:
    return ", ".join(items) or "–"


def _row(v: Verdict) -> str:
    ref = v.ref
    commits = ", ".join(f"`{c[:12]}`" for c in ref.commits) or "none recorded"
    if not ref.commits or v.missing:
        why = (
            "its report records no commit"
            if not ref.commits
            else f"{_names(f'`{c[:12]}`' for c in v.missing)} not in this clone's history "
            "(a shallow clone: `git fetch --unshallow`)"
        )
        return f"| `{ref.folder}/` | {commits} | ? | {why} |"
    changed = _names(f"{s} ({len(files)})" for s, files in v.changed.items())
    return f"| `{ref.folder}/` | {commits} | {_names(v.current)} | {changed} |"


def _details(v: Verdict) -> list[str]:
    """The changed files of a reference, by folder, with the stages they belong to."""
    folders: dict[str, tuple[dict, dict]] = {}  # folder: ({file name}, {stage}), ordered
    for stage, files in v.changed.items():
        for f in files:
            names, stages = folders.setdefault(str(Path(f).parent), ({}, {}))
            names[Path(f).name] = stages[stage] = None
    if not folders:
        return []
    count = sum(len(names) for names, _ in folders.values())
    since = ", ".join(f"<code>{c[:12]}</code>" for c in v.ref.commits)
    rows = [
        f"| `{folder}/` | {', '.join(f'`{n}`' for n in sorted(names))} | {', '.join(stages)} |"
        for folder, (names, stages) in sorted(folders.items())
    ]
    return [
        f"<details><summary><code>{v.ref.folder}/</code>: {count} files changed since {since},"
        " by folder, with the stages they belong to</summary>",
        "",
        "| folder | files | stages |",
        "|---|---|---|",
        *rows,
        "",
        "</details>",
        "",
    ]


def table(verdicts: list[Verdict]) -> str:
    """The status table: one row per reference, then each one's changed files."""
    lines = [
        "| reference | run by commit | current | changed since that commit (files) |",
        "|---|---|---|---|",
        *(_row(v) for v in verdicts),
        "",
    ]
    for v in verdicts:
        lines += _details(v)
    return "\n".join(lines)


def with_table(text: str, body: str) -> str:
    """`text` with `body` between the marker comments (which must be there, once each)."""
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not (sep and sep2):
        raise ValueError(f"the marker comments {BEGIN!r} and {END!r} are missing")
    return f"{head}{BEGIN}\n{body}\n{END}{tail}"


def committed_table(text: str) -> str:
    """What stands between the marker comments of `text`."""
    return text.partition(BEGIN)[2].partition(END)[0].strip("\n")


def dirty_stage_files(verdicts: list[Verdict], root: Path = ROOT) -> list[str]:
    """Changed files that are not committed: the table counts them (it reads the tree)."""
    status = git(root, "status", "--porcelain", "--untracked-files=all") or ""
    dirty = {line[3:].split(" -> ")[-1].strip() for line in status.splitlines() if line}
    return sorted(dirty & {f for v in verdicts for fs in v.changed.values() for f in fs})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("folders", nargs="*", type=Path, help="report folders (default: references)")
    ap.add_argument(
        "--write", action="store_true", help=f"write the table into {REFERENCE}/README.md"
    )
    args = ap.parse_args(argv)
    if args.write and args.folders:
        ap.error("--write writes every reference's table: give no folders")
    configure("staleness")
    verdicts = [verdict(read_reference(f)) for f in args.folders or references()]
    body = table(verdicts)
    for v in verdicts:
        if v.missing:
            log.warning(
                "%s: commit %s is not in this clone's history (a shallow clone?): its stages "
                "cannot be compared", v.ref.folder, ", ".join(v.missing)
            )  # fmt: skip
    if dirty := dirty_stage_files(verdicts):
        log.warning("uncommitted changes counted as changes: %s", ", ".join(dirty))
    if not args.write:
        sys.stdout.write(body + "\n")
        return 0
    readme = ROOT / REFERENCE / "README.md"
    readme.write_text(with_table(readme.read_text(), body))
    log.info(
        "wrote the staleness table of %d references into %s", len(verdicts),
        readme.relative_to(ROOT),
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
