"""Render report/<machine>/report.md from the run's CSVs with jinja2.

    python -m cs336_systems.reporting.report --results results/M --out report/M/report.md --stages a,b

Every number and sentence comes from the stage analyses (`cs336_systems.stages.<stage>.analysis.context`).
The report opens with the coverage table (reporting/coverage.py: which parts of the handout's
problems, docs/questions.md, this run answers),
the header (the machine and its software, the run's wall time) and each stage's provenance.
Beside report.md go report.html (the same report as one page, figures embedded: Snakemake's
own report shows it) and tables/ (every table as LaTeX and Typst, reporting/export.py); with
`--table-pages a.csv,b.csv --pages DIR`, each stage CSV as an HTML page in DIR, which Snakemake's
report shows (a CSV it only offers for download).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib
import os
import re
import time
from pathlib import Path

import jinja2
import pandas as pd

from cs336_systems.core.results import ABSENT, PROVENANCE_COLUMNS, atomic_write_text, git_state
from cs336_systems.planning.log import configure, get_logger
from cs336_systems.reporting import coverage, digest, export, questions, sanity, staleness
from cs336_systems.reporting.analysis import (
    fmt,
    md_table,
    pct,
    placeholder_reason,
    sig,
    status_summary,
)
from cs336_systems.reporting.markdown import csv_page, to_html

log = get_logger(__name__)
TEMPLATES = Path(__file__).resolve().parents[3] / "report" / "templates"
STAGES_DIR = Path(__file__).resolve().parents[1] / "stages"
DEFAULT_EDITION = "2026"
_GPU_NAME = re.compile(
    r"NVIDIA|Tesla|GeForce|Quadro|RTX|\bA100\b|\bH100\b|\bH200\b|\bB200\b|AMD Instinct|Radeon"
)


def stage_package(stage: str):
    """The stage's package (`cs336_systems.stages.<stage>`): its TITLE, ORDER and QUESTIONS."""
    return importlib.import_module(f"cs336_systems.stages.{stage}")


def all_stages() -> list[str]:
    return sorted(p.parent.name for p in STAGES_DIR.glob("*/__init__.py"))


def order_stages(stages: list[str]) -> list[str]:
    """Sections in the stages' own ORDER, then by name."""
    return sorted(stages, key=lambda s: (getattr(stage_package(s), "ORDER", 999), s))


# ---------------------------------------------------------------------------------- provenance


def stage_csvs(results_dir: Path, stage: str) -> list[Path]:
    """The stage's CSVs in a results folder: `<stage>.csv` and `<stage>_*.csv`."""
    return sorted(
        p
        for p in Path(results_dir).glob("*.csv")
        if p.stem == stage or p.stem.startswith(stage + "_")
    )


def read_provenance(paths: list[Path]) -> pd.DataFrame:
    frames = []
    for csv in paths:
        try:
            df = pd.read_csv(csv, usecols=lambda c: c in PROVENANCE_COLUMNS, dtype=str)
        except (pd.errors.EmptyDataError, ValueError):
            continue
        if len(df):
            frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _values(prov: pd.DataFrame, col: str) -> list[str]:
    if col not in prov:
        return []
    vals = prov[col].dropna().astype(str)
    return sorted(v for v in vals.unique() if v not in ("", "nan"))


def _joined(prov: pd.DataFrame, col: str, absent: str = ABSENT) -> str:
    return ", ".join(_values(prov, col)) or absent


def gpu_count(prov: pd.DataFrame) -> int:
    """GPUs the rows saw: the `gpu_count` column, else (older CSVs) a GPU-like device name,
    the machine tag's `-xN` naming several."""
    if len(prov) == 0:
        return 0
    if "gpu_count" in prov and prov["gpu_count"].notna().any():
        return int(pd.to_numeric(prov["gpu_count"], errors="coerce").max())
    names = _values(prov, "device_name")
    if not any(_GPU_NAME.search(n) for n in names):
        return 0
    tags = [re.search(r"-x(\d+)$", m) for m in _values(prov, "machine")]
    return max([int(t.group(1)) for t in tags if t] or [1])


def cuda_text(prov: pd.DataFrame) -> str:
    """The machine's CUDA; on a machine without a GPU 'none', with the CUDA torch was built for
    (older CSVs recorded only the latter, in `cuda`)."""
    built = _values(prov, "torch_cuda") or _values(prov, "cuda")
    built = [b for b in built if b not in ("none", ABSENT)]
    if gpu_count(prov) == 0:
        return f"none (CPU run; torch built for CUDA {', '.join(built)})" if built else "none"
    return _joined(prov, "cuda")


def commit_text(prov: pd.DataFrame) -> str:
    commits = _values(prov, "git_commit")
    out = ", ".join(f"`{c}`" for c in commits) or "–"
    dirty = sorted({f for v in _values(prov, "git_dirty_files") for f in v.split()})
    if dirty:
        out += " (dirty tree; uncommitted changes in " + ", ".join(f"`{f}`" for f in dirty) + ")"
    elif any(c.endswith("-dirty") for c in commits):
        out += " (dirty tree; the files were not recorded)"
    return out


def since_text(prov: pd.DataFrame, stages: list[str]) -> str:
    """How to tell which of the run's stages changed since its commit; where the tree was dirty,
    the stages whose files (reporting/staleness.py) held its uncommitted changes."""
    out = (
        "`python -m cs336_systems.reporting.staleness <this report's folder>` names the stages"
        " whose code, config or section template changed since the commit above"
    )
    dirty = {f for v in _values(prov, "git_dirty_files") for f in v.split()}
    if not dirty:
        return out
    touched = [s for s in stages if dirty & set(staleness.stage_files(s))]
    return out + (
        f"; at the run, uncommitted changes touched the files of {', '.join(touched)}"
        if touched
        else "; at the run, no stage's files held uncommitted changes"
    )


def _unit(text: str, unit: str) -> str:
    return f"{text} {unit}" if text != ABSENT else text


def _numbers(prov: pd.DataFrame, col: str) -> str:
    """A numeric provenance column's distinct values, written alike ("700.00" from nvidia-smi
    and "700.0" from a float column are one value: 700)."""
    out = []
    for v in _values(prov, col):
        try:
            v = f"{float(v):g}"
        except ValueError:
            pass
        if v not in out:
            out.append(v)
    return ", ".join(out) or ABSENT


def provenance_row(stage: str, prov: pd.DataFrame) -> dict:
    gpus = gpu_count(prov)
    cores = _values(prov, "cpu_cores")
    cpu = _joined(prov, "cpu_model") if "cpu_model" in prov else ABSENT
    if cpu != ABSENT and cores:
        cpu += f" ({', '.join(cores)} cores)"
    return {
        "stage": stage,
        "git commit": commit_text(prov),
        "device": _joined(prov, "device_name"),
        "driver": _joined(prov, "driver"),
        "CUDA": cuda_text(prov),
        "NCCL": _joined(prov, "nccl") if gpus or "nccl" in prov else ABSENT,
        "nsys": _joined(prov, "nsys"),
        "CPU": cpu,
        # the cards its rows were measured on (planning/claim.py gives each job its own)
        "GPU index": _joined(prov, "gpu_index") if gpus else ABSENT,
        "GPU max SM clock": _unit(_numbers(prov, "gpu_sm_clock_max_mhz"), "MHz"),
        "GPU power limit": _unit(_numbers(prov, "gpu_power_limit_w"), "W"),
        "torch / triton": f"{_joined(prov, 'torch')} / {_joined(prov, 'triton')}",
    }


def busy_seconds(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one of the (start, end) spans (their union's length)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def run_wall_time(results_dir: Path, prov: pd.DataFrame) -> dict:
    """The run's wall time, first job start to last job end, from Snakemake's per-job benchmark
    files (`jobs/**/*.tsv`: a job ends when its file is written and started its `s` seconds
    before); without them, from the rows' timestamps (first to last: the last job's own
    duration is missing)."""
    starts, ends, job_s = [], [], 0.0
    for tsv in Path(results_dir, "jobs").rglob("*.tsv"):
        try:
            s = float(pd.read_csv(tsv, sep="\t")["s"].sum())
        except (pd.errors.EmptyDataError, KeyError, ValueError):
            continue
        end = tsv.stat().st_mtime
        starts.append(end - s)
        ends.append(end)
        job_s += s
    if starts:
        start, end = min(starts), max(ends)
        busy = busy_seconds(list(zip(starts, ends, strict=True)))
        idle = (end - start) - busy
        # a run resumed over several sessions (e.g. device calls of 10 minutes) has pauses
        # between them that no job ran in: the wall time counts them, the busy time does not
        paused = f"; {idle / 60:.1f} min with no job running" if idle > 60 else ""
        return {
            "minutes": (end - start) / 60,
            "busy_minutes": busy / 60,
            "start": dt.datetime.fromtimestamp(start, dt.UTC).isoformat(timespec="seconds"),
            "end": dt.datetime.fromtimestamp(end, dt.UTC).isoformat(timespec="seconds"),
            "source": (
                f"first job start to last job end, from Snakemake's per-job benchmark files "
                f"({len(starts)} timed jobs, {job_s / 60:.1f} min of job time{paused})"
            ),
        }
    stamps = (
        pd.to_datetime(prov["timestamp"], utc=True, errors="coerce").dropna()
        if "timestamp" in prov
        else pd.Series(dtype="datetime64[ns, UTC]")
    )
    if len(stamps):
        return {
            "minutes": (stamps.max() - stamps.min()).total_seconds() / 60,
            "start": stamps.min().isoformat(),
            "end": stamps.max().isoformat(),
            "source": (
                "first to last row timestamp (no per-job benchmark files here: the last job's "
                "own duration is not counted)"
            ),
        }
    return {"minutes": float("nan"), "start": "–", "end": "–", "source": "no timing data"}


def header(results_dir: Path, stages: list[str] | None = None) -> dict:
    """Machine, device, software, preset and commit from the CSVs' provenance columns; the run's
    wall time; one provenance row per stage."""
    results_dir = Path(results_dir)
    prov = read_provenance(sorted(results_dir.glob("*.csv")))
    per_stage = []
    for stage in stages if stages is not None else all_stages():
        p = read_provenance(stage_csvs(results_dir, stage))
        if len(p):
            per_stage.append(provenance_row(stage, p))
    wall = run_wall_time(results_dir, prov)
    gpus = gpu_count(prov)
    return {
        "machine": _joined(prov, "machine"),
        "device_name": _joined(prov, "device_name"),
        "kind": f"{gpus} GPU{'s' if gpus > 1 else ''}" if gpus else "CPU only",
        "torch": _joined(prov, "torch"),
        "triton": _joined(prov, "triton"),
        "cuda": cuda_text(prov),
        "preset": _joined(prov, "preset"),
        "git_commit": commit_text(prov),
        "since": since_text(prov, [r["stage"] for r in per_stage]),
        "first_result": wall["start"],
        "last_result": wall["end"],
        "wall_minutes": wall["minutes"],
        "busy_minutes": wall.get("busy_minutes", wall["minutes"]),
        "wall_source": wall["source"],
        "provenance_table": md_table(pd.DataFrame(per_stage), numparse=False) if per_stage else "",
        "rendered": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "rendered_by": renderer_text(prov),
    }


def renderer_text(prov: pd.DataFrame) -> str:
    """The commit of the code that renders the report, where it is not the run's (a report
    rendered again from a finished run's results by newer analysis code says so)."""
    commit, dirty = git_state(Path(__file__).resolve().parents[3])
    runs = _values(prov, "git_commit")
    if commit == "unknown" or any(r.startswith(commit) or commit.startswith(r) for r in runs):
        return ""
    files = f" (changed: {', '.join(dirty)})" if dirty else ""
    return f" by commit `{commit}`{files}, from this run's results (measured by the commit above)"


# ------------------------------------------------------------------------------------ coverage


def declared_questions() -> dict[str, dict[str, dict]]:
    """Every stage's QUESTIONS declaration (part id -> evidence), whether or not it ran."""
    return {st: getattr(stage_package(st), "QUESTIONS", {}) for st in all_stages()}


def edition_of(results_dir: Path) -> str:
    eds = _values(read_provenance_edition(results_dir), "edition")
    return eds[0] if len(eds) == 1 else DEFAULT_EDITION


def section_edition(results_dir: Path, stage: str, report_edition: str) -> str:
    """Which edition a section answers, in words, from its rows' `edition`."""
    eds = _values(read_provenance_edition(results_dir, stage_csvs(results_dir, stage)), "edition")
    if len(eds) == 1:
        return f"the {eds[0]} edition (its rows' `edition`)"
    if eds:
        return f"a mix of editions ({', '.join(eds)}): rerun the stage under one"
    return f"the {report_edition} edition (the report's: its rows do not record one)"


def read_provenance_edition(results_dir: Path, csvs: list[Path] | None = None) -> pd.DataFrame:
    frames = []
    for csv in csvs if csvs is not None else sorted(Path(results_dir).glob("*.csv")):
        try:
            frames.append(pd.read_csv(csv, usecols=lambda c: c == "edition"))
        except (pd.errors.EmptyDataError, ValueError):
            continue
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def coverage_of(
    results_dir: Path,
    contexts: dict[str, dict],
    edition: str,
    machine: str,
    suspects: dict[str, int] | None = None,
) -> pd.DataFrame:
    prov = read_provenance(sorted(Path(results_dir).glob("*.csv")))
    facts = coverage.RunFacts(
        suspects=dict(suspects or {}),
        deviations=questions.protocol_deviations(protocol_used(results_dir)),
        sizes={st: sizes_measured(results_dir, st) for st in contexts},
        grids={st: grid_ran(results_dir, st) for st in contexts},
    )
    return coverage.coverage_table(
        edition,
        declared_questions(),
        contexts,
        coverage.Machine(gpus=gpu_count(prov), name=machine),
        facts=facts,
    )


def sizes_measured(results_dir: Path, stage: str) -> list[str]:
    """The model sizes (`size`) of the stage's main rows that ran (status ok): `<stage>.csv`
    (its side CSVs may hold other shapes, e.g. one xl block's saved tensors)."""
    try:
        df = pd.read_csv(
            Path(results_dir) / f"{stage}.csv", usecols=lambda c: c in ("size", "status"), dtype=str
        )
    except (FileNotFoundError, pd.errors.EmptyDataError, ValueError):
        return []
    if "size" not in df or "status" not in df:
        return []
    return sorted(set(df.loc[df["status"] == "ok", "size"].dropna()))


def grid_ran(results_dir: Path, stage: str) -> dict[str, list]:
    """{column: values} of the stage's main rows that ran (ok, or out of memory), for the grid
    columns a handout asks (reporting/questions.py: GRID_ASKED)."""
    keep = {*questions.GRID_COLUMNS, "status"}
    try:
        df = pd.read_csv(Path(results_dir) / f"{stage}.csv", usecols=lambda c: c in keep)
    except (FileNotFoundError, pd.errors.EmptyDataError, ValueError):
        return {}
    if "status" not in df:
        return {}
    ran_rows = df[df["status"].isin(["ok", "oom"])]
    return {
        c: sorted(ran_rows[c].dropna().unique().tolist(), key=str)
        for c in ran_rows
        if c != "status"
    }


def protocol_of(results_dir: Path, preset: str) -> str:
    """The run's protocol against the handout's (reporting/questions.py: PROTOCOL), from the columns
    the stages' rows recorded."""
    return questions.protocol_note(protocol_used(results_dir), preset)


def protocol_used(results_dir: Path) -> dict[str, dict[str, list[int]]]:
    """stage -> {protocol column: the distinct values its rows recorded}."""
    used = {}
    for stage, keys in questions.PROTOCOL.items():
        csv = Path(results_dir) / f"{stage}.csv"
        try:
            df = pd.read_csv(csv, usecols=lambda c, keys=keys: c in keys)
        except (FileNotFoundError, pd.errors.EmptyDataError, ValueError):
            continue
        used[stage] = {
            k: sorted({int(v) for v in pd.to_numeric(df[k], errors="coerce").dropna()})
            for k in keys
            if k in df
        }
    return used


# -------------------------------------------------------------------------------------- render


def environment(
    templates: Path = TEMPLATES, results_dir: Path | None = None, report_dir: Path | None = None
) -> jinja2.Environment:
    """The templates' environment. `link(path)` makes a path (relative to the working
    directory, as the analyses name them) a markdown link from the report's folder (`report_dir`,
    default report/<machine>/) where it lies inside that folder, which travels with the report;
    a path of the results (raw captures, not committed with a reference) is named as text with
    the command that writes it again (`raw_text`). `raw_link(stage)` names the stage's raw
    captures, results/<machine>/<stage>/raw/, so."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    results_dir = Path(results_dir) if results_dir is not None else Path("results", "machine")
    report_dir = Path(report_dir) if report_dir is not None else Path("report", results_dir.name)

    def link(path) -> str:
        href = Path(os.path.relpath(Path(path), report_dir)).as_posix()
        if href.startswith("../") or Path(path).is_absolute():
            return raw_text(path, results_dir)
        return f"[`{path}`]({href}{'/' if str(path).endswith('/') else ''})"

    env.filters.update(fmt=fmt, pct=pct, sig=sig, status_summary=status_summary, link=link)
    env.globals.update(
        md_table=md_table, raw_link=lambda stage: link(f"{results_dir.as_posix()}/{stage}/raw/")
    )
    return env


def raw_text(path, results_dir: Path) -> str:
    """A file outside the report's folder (a raw capture under results/, not kept with a
    reference report) named as text, with the command that writes it again: a link to it would
    be dead from report/reference/<machine>/ and inside Snakemake's report archive."""
    rel = Path(os.path.relpath(Path(path), Path(results_dir))).parts
    stage = rel[0] if rel and rel[0] != ".." else ""
    again = (
        f"`snakemake --cores 1 report --forcerun {stage}` writes it again"
        if stage
        else "not written again by the report"
    )
    return f"`{path}` (raw capture, not kept with the report: {again})"


def contexts_of(
    results_dir: Path, stages: list[str], tables: dict | None = None
) -> tuple[dict, dict]:
    """({stage: context}, {stage: suspect rows}) of the stages, each context computed with the
    sanity checks' findings collected; `tables` gets every table a context renders, by name
    (reporting/export.py)."""
    contexts, suspects, seconds = {}, {}, {}
    for stage in order_stages(stages):
        t0 = time.perf_counter()
        module = importlib.import_module(f"cs336_systems.stages.{stage}.analysis")
        with sanity.collecting() as found, export.recording() as rendered:
            contexts[stage] = module.context(Path(results_dir))
        suspects[stage] = sanity.owned(found, stage)
        if tables is not None:
            tables.update(export.name_tables(stage, contexts[stage], rendered))
        seconds[stage] = time.perf_counter() - t0
    slowest = sorted(seconds.items(), key=lambda kv: -kv[1])[:3]
    log.info(
        "the stages' sections in %.1f s (the slowest: %s)",
        sum(seconds.values()),
        ", ".join(f"{s} {t:.1f} s" for s, t in slowest),
    )
    return contexts, suspects


FIGURE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+\.png)\)")


def without_placeholders(body: str, fig_dir: str, fig_root: Path | None) -> str:
    """Each embedded figure that is a placeholder (reporting/analysis.py empty_figure) replaced by its
    reason in words: a blank image with a sentence in it says less than the sentence."""
    if fig_root is None:
        return body

    def swap(m: re.Match) -> str:
        name = m.group(2).removeprefix(fig_dir.rstrip("/") + "/")
        why = placeholder_reason(Path(fig_root) / name)
        return m.group(0) if why is None else f"_No figure ({m.group(1)}): {why}._"

    return FIGURE.sub(swap, body)


def render(
    results_dir: Path,
    stages: list[str],
    fig_dir: str = "figures",
    templates: Path = TEMPLATES,
    edition: str | None = None,
    tables: dict | None = None,
    report_dir: Path | None = None,
) -> str:
    """The report's markdown; `tables` (a dict) gets every table in it, by name, for the
    write-up's LaTeX and Typst copies; `report_dir`: where the report goes (its `fig_dir` is
    where placeholder figures are recognized and named instead of embedded)."""
    fig_root = Path(report_dir) / fig_dir if report_dir is not None else None
    results_dir = Path(results_dir)
    edition = edition or edition_of(results_dir)
    lengths = digest.answer_lengths(edition)
    env = environment(templates, results_dir, report_dir)
    contexts, suspects = contexts_of(results_dir, stages, tables)
    sections, shown_by = [], {}
    for stage, ctx in contexts.items():
        body = env.get_template(f"sections/{stage}.md.j2").render(s=ctx, fig_dir=fig_dir)
        body = without_placeholders(body, fig_dir, fig_root)
        body, shown = digest.fold(body, lengths)
        shown_by.update({k: v for k, v in shown.items() if k not in shown_by})
        suspect = suspects[stage]
        with export.recording() as rendered:
            suspect_table = md_table(suspect) if len(suspect) else ""
        if tables is not None:
            tables.update(export.name_tables(stage, {"suspect": suspect_table}, rendered))
        sections.append(
            {
                "stage": stage,
                "title": stage_package(stage).TITLE,
                "body": body,
                "suspect": suspect_table,
                "n_suspect": len(suspect),
            }
        )
    with export.recording() as rendered:
        h = header(results_dir, list(contexts))
        for sec in sections:
            sec["edition"] = section_edition(results_dir, sec["stage"], edition)
        cov = coverage_of(
            results_dir,
            contexts,
            edition,
            results_dir.name,
            {st: len(rows) for st, rows in suspects.items()},
        )
        coverage_table = md_table(coverage.handout_rows(cov), numparse=False)
        own = coverage.own_rows(cov)
        own_table = md_table(own, numparse=False) if len(own) else ""
    if tables is not None:
        named = {"provenance": h["provenance_table"], "coverage": coverage_table}
        named["own_coverage"] = own_table
        tables.update(export.name_tables("report", named, rendered))
    text = env.get_template("report.md.j2").render(
        h=h,
        sections=sections,
        edition=edition,
        coverage=coverage_table,
        coverage_counts=coverage.summary(cov),
        own_coverage=own_table,
        appendix=coverage.appendix(edition),
        protocol=protocol_of(results_dir, h["preset"]),
        **findings(contexts, shown_by, cov, edition),
    )
    numbers = questions.report_numbers()
    if tables is not None:
        renumber_tables(tables, numbers)
    return digest.renumber(text, numbers)


def renumber_tables(tables: dict, numbers: dict[int, int]) -> None:
    """The write-up's copies of the tables (`tables`, by name) with the report's `Q<n>`."""
    for name, t in tables.items():
        cells = t.cells.map(lambda v: digest.renumber(v, numbers) if isinstance(v, str) else v)
        tables[name] = dataclasses.replace(
            t, markdown=digest.renumber(t.markdown, numbers), cells=cells
        )


def findings(contexts: dict, shown_by: dict[int, str], cov: pd.DataFrame, edition: str) -> dict:
    """The summary of findings: a line per answer given (its first sentence, or the context's
    `summary` entry for it: {answer key or "q<key>": sentence}), and the parts not answered on
    this machine, one line per reason (the coverage table's `why`). A coverage row is read by
    the part its `part` cell names (`[label](...)`)."""
    by_label = {questions.label(p): p for p in questions.edition_parts(edition)}
    rows, where = [], {}
    for r in cov.to_dict("records") if len(cov) else []:
        m = re.match(r"^\[([^\]]+)\]", str(r.get("part", "")))
        part = by_label.get(m.group(1) if m else str(r.get("part", "")))
        if part is not None and part["kind"] != "code":
            rows.append((part, str(r.get("status", "")), str(r.get("why", "") or "")))
            link = re.search(r"\[[^\]]+\]\(#[\w-]+\)", str(r.get("answered in", "")))
            if link and part.get("answer"):
                where.setdefault(part["answer"], link.group(0))
    status = digest.answer_status([p["id"] for p, _, _ in rows], [st for _, st, _ in rows])
    given = [c.get("summary") for c in contexts.values() if isinstance(c, dict)]
    own = {
        int(str(key).lstrip("qQ")): text
        for entry in given
        if isinstance(entry, dict)
        for key, text in entry.items()
        if str(key).lstrip("qQ").isdigit()
    }
    return {
        "summary": digest.summary_lines(shown_by, status, own, where, questions.report_numbers()),
        "not_answered": digest.not_answered_lines(
            [(questions.label(p), st, why) for p, st, why in rows]
        ),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--stages", required=True)
    ap.add_argument(
        "--edition", default=None, help="the course edition (default: the rows' `edition`, or 2026)"
    )
    ap.add_argument(
        "--table-pages", default="", help="CSVs (comma-separated) each written as an HTML page"
    )
    ap.add_argument("--pages", type=Path, help="the folder of those pages, <CSV stem>.html each")
    args = ap.parse_args(argv)
    configure("report")
    stages = [s for s in args.stages.split(",") if s]
    fig_dir = os.path.relpath(args.out.parent / "figures", args.out.parent)
    tables: dict = {}
    text = render(
        args.results, stages, fig_dir, edition=args.edition, tables=tables,
        report_dir=args.out.parent,
    )  # fmt: skip
    atomic_write_text(args.out, text)
    log.info("wrote %s (%d lines, stages: %s)", args.out, len(text.splitlines()), ", ".join(stages))
    # the same report as one page (figures embedded): a page of Snakemake's own report
    html = args.out.with_suffix(".html")
    atomic_write_text(html, to_html(text, args.out.parent, title=text.splitlines()[0].lstrip("# ")))
    # every table for a write-up, as LaTeX (booktabs) and Typst
    export.write_tables(tables, args.out.parent / "tables")
    log.info(
        "wrote %s and %d tables (.tex, .typ) in %s", html, len(tables), args.out.parent / "tables"
    )
    # every stage table as a page: Snakemake's report shows HTML in its page, a CSV it downloads
    for csv in (Path(c) for c in args.table_pages.split(",") if c):
        page = args.pages / f"{csv.stem}.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(page, csv_page(csv, title=csv.name))


if __name__ == "__main__":
    main()
