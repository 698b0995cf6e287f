"""The documented commands work as written: every `snakemake` command of the README and of the
GPU guide, found in its code blocks and code spans, run in its dry form (`-n`) in a copy of the
workflow on this machine (`<placeholders>` filled in)."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
from pipeline_utils import ROOT, copy_workflow, env_for, snakemake

DOCS = ["README.md", "docs/own-gpus.md"]
# how a command starts (what runs snakemake), and what stands before it
LAUNCHER = re.compile(
    r"^(?:time )?((?:[A-Z_]+=\S+ )*)(?:uv run (?:--no-sync )?|\.venv/bin/)?snakemake\b"
)


def documented(path: Path) -> list[tuple[str, str]]:
    """(command, its comment) of every snakemake command in the file."""
    text = path.read_text()
    found = []
    for block in re.findall(r"```(?:bash)?\n(.*?)```", text, re.S):
        for line in block.splitlines():
            command, _, comment = line.partition("  #")
            if LAUNCHER.match(command.strip()):
                found.append((command.strip(), comment.strip()))
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`([^`]+)`", prose):
        span = " ".join(span.split())  # a span may wrap a line
        if LAUNCHER.match(span):
            found.append((span, ""))
    return found


def plan_of(command: str) -> tuple[str, ...]:
    """What a command plans: its words without the launcher, the environment and --cores
    (`--cores 4 report` plans what `--cores 1 report` does)."""
    words = shlex.split(LAUNCHER.sub("", command))
    return tuple(w for i, w in enumerate(words) if w != "--cores" and words[i - 1] != "--cores")


def documented_commands() -> list[str]:
    return [c for doc in DOCS for c, _ in documented(ROOT / doc)]


def commands() -> list[tuple[str, str]]:
    """One command of each plan (the first written), with its comment."""
    seen, out = set(), []
    for doc in DOCS:
        for command, comment in documented(ROOT / doc):
            if plan_of(command) not in seen and "..." not in command:
                seen.add(plan_of(command))
                out.append((command, comment))
    return out


def test_the_docs_show_the_commands_this_test_runs():
    found = documented_commands()
    for expected in (
        "uv run snakemake --cores 1 report",
        "uv run snakemake --cores 4 report",
        "uv run snakemake --report report.zip",
        "snakemake -n --quiet rules",
    ):
        assert expected in found, found
    assert not any("--quiet rules progress" in c for c in found)


@pytest.fixture(scope="module")
def workflow(tmp_path_factory):
    work = copy_workflow(tmp_path_factory.mktemp("readme"))
    for machine in ("cpu", "h100-80gb-hbm3"):  # the compare example's folders
        src = ROOT / "report" / "reference" / machine / "csv"
        shutil.copytree(src, work / "report" / "reference" / machine / "csv")
    return work


@pytest.mark.slow
@pytest.mark.parametrize("command,comment", commands(), ids=[c for c, _ in commands()])
def test_a_documented_command_runs_as_written(workflow, command, comment):
    env = env_for(workflow)
    words = shlex.split(LAUNCHER.sub(lambda m: m.group(1), command))
    while words and re.match(r"^[A-Z_]+=", words[0]):  # VAR=value before the command
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    words = [re.sub(r"<[^>]+>", "readme-test", w) for w in words]  # machine=<tag>
    if "--report" in words:
        pytest.skip(
            "needs a finished run: tests/integration/test_pipeline.py builds and reads the archive"
        )
    if "--configfile" in words:  # the example file its comment shows
        path = workflow / words[words.index("--configfile") + 1]
        path.write_text(comment.split("e.g.", 1)[1].strip() + "\n")
    if not {"-n", "--dry-run", "--summary", "--lint"} & set(words):
        words.append("-n")
    proc = snakemake(workflow, *words, check=False, env=env)
    out = proc.stdout + proc.stderr
    if "--lint" in words:  # as the README says: no lint but the conda/container one
        lints = [ln for ln in out.splitlines() if re.match(r"^\s*\* ", ln)]
        assert lints and all("conda environment or container" in ln for ln in lints), out
        return
    assert proc.returncode == 0, f"{command}:\n{out[-3000:]}"
    if "--summary" not in words:
        assert "Job stats:" in out or "Nothing to be done" in out, f"{command} planned nothing"
