"""Which parts of the handouts a run answers: answered, partly or not on this machine, and why.

The parts are reporting/questions.py's (one per lettered part of each problem of the edition;
docs/questions.md lists them). A stage says which parts it answers, and how to tell, by
declaring data in its package's `__init__.py` (no imports needed)::

    QUESTIONS = {
        "benchmarking_script.b": {"evidence": ["latency_fp32", "bwd"], "needs": "gpu"},
    }

- ``evidence``: keys of the stage's report context (dotted for nested dicts) that hold the
  answer: all present and non-empty → answered; some → partly; none → not answered.
- ``needs``: ``"gpu"`` (the question is about a GPU: on a CPU run the stage's numbers describe
  the CPU, so the answer is partial) or ``"gpus:N"`` (N GPUs of one host).
- a stage's context may also return ``coverage = {part: {"status": "partly", "why": "..."}}``
  for what only its data can tell (a status there can lower, never raise, the verdict).

`coverage_table` turns the declarations, the run's contexts and what the run's rows say
(`RunFacts`: suspect rows left out, departures from the handout's protocol, the model sizes
measured) and the machine into one row per part with the reason and the command or machine that
answers it. An answer is `partly` where the machine lacks the GPUs asked, where its stage ran
the handout's protocol with other counts, or where it measured another model than the one the
handout names. A `code` part (an implementation) is listed with where it lives and the result
of the tests that check it in this run (the kernel_tests stage's rows: `passed`, `failed` or
`not run`). The handout's parts (written and code: its own count) and the questions beside them
(optional, the study's own) are two tables: `handout_rows`, `own_rows`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

from cs336_systems.reporting.questions import (
    ANSWERS,
    HANDOUT_KINDS,
    PROTOCOL_PARTS,
    SECTIONS,
    anchor,
    edition_parts,
    grid_missing,
    label,
    model_asked,
    part_test_files,
)

STATUS_ORDER = {"answered": 0, "partly": 1, "not": 2}
CODE_ORDER = {"passed": 0, "failed": 1, "not run": 2}
REPORT_COMMAND = "snakemake --cores 1 report"
# the list the coverage table links to: the report's own appendix (`appendix`), so that the link
# works wherever the report is read (report/<machine>/, a committed reference folder, the HTML
# page inside Snakemake's report archive); docs/questions.md is the repository's copy
ANCHOR_PREFIX = "part-"
OUTCOMES = ("passed", "failed", "error", "skipped")


def edition_questions(edition: str) -> list[str]:
    """The part ids of `edition` (its handout's parts and the questions beside them), in the
    handout's order: the rows of `coverage_table`."""
    return [p["id"] for p in edition_parts(edition)]


@dataclass
class RunFacts:
    """What the run's rows say beyond the contexts: per stage, its suspect rows left out, how it
    departs from the handout's protocol ('' where it keeps it) and the model sizes its rows
    measured (status ok)."""

    suspects: dict[str, int] = field(default_factory=dict)
    deviations: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, list[str]] = field(default_factory=dict)
    # stage -> {column of GRID_COLUMNS: the values of its rows that ran (ok or oom)}
    grids: dict[str, dict[str, list]] = field(default_factory=dict)


@dataclass
class Machine:
    """What the run's machine could do: its device kind and how many GPUs one host had."""

    gpus: int = 0
    name: str = "cpu"

    @property
    def kind(self) -> str:
        return "GPU" if self.gpus else "CPU"


def lookup(ctx: dict, key: str):
    """ctx['a']['b'] for 'a.b' (None where any part is missing)."""
    cur = ctx
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _present(value) -> bool:
    if value is None or value is False:
        return False
    if isinstance(value, str | list | dict | tuple):
        return len(value) > 0
    if isinstance(value, pd.DataFrame):
        return len(value) > 0
    return True


def _needs_gpus(needs: str | None) -> int:
    if not needs:
        return 0
    if needs == "gpu":
        return 1
    if needs.startswith("gpus:"):
        return int(needs.split(":", 1)[1])
    raise ValueError(f"unknown need {needs!r}: use 'gpu' or 'gpus:N'")


def _machine_for(n: int) -> str:
    return "a CUDA GPU" if n == 1 else f"one host with {n} GPUs"


def _verdict(
    stage: str, spec: dict, ctx: dict | None, machine: Machine, part: str, n_suspect: int = 0
):
    """(status, why, how) of one stage's answer to a part."""
    if ctx is None:
        return (
            "not",
            f"stage `{stage}` is not in this run",
            f"`{REPORT_COMMAND} --config stages=all` (or add `{stage}` to `stages`)",
        )
    if not ctx.get("available", False):
        return (
            "not",
            f"stage `{stage}` produced no usable data (see its section)",
            f"its log under `results/{machine.name}/logs/`; rerun `{REPORT_COMMAND}`",
        )
    evidence = spec.get("evidence", [])
    have = [k for k in evidence if _present(lookup(ctx, k))]
    status = "answered" if len(have) == len(evidence) else ("partly" if have else "not")
    why, how = "", ""
    suspect = (
        f"{n_suspect} of its measured rows ran but failed a sanity check and"
        f" {'are' if n_suspect > 1 else 'is'} left out (the section's Suspect numbers)"
        if n_suspect
        else ""
    )
    if status != "answered":
        missing = [k for k in evidence if k not in have]
        why = f"stage `{stage}` has no data for {', '.join(f'`{m}`' for m in missing)}"
        if suspect:
            why = f"{why}: {suspect}"
        how = f"the preset's full grid: `{REPORT_COMMAND}` (see the section's failed points)"
    need = _needs_gpus(spec.get("needs"))
    if need and machine.gpus < need and status != "not":
        status = "partly"
        what = "no GPU" if machine.gpus == 0 else f"{machine.gpus} GPU(s)"
        why = (
            f"measured on this machine ({what}); the question is about "
            f"{'a GPU' if need == 1 else f'{need} GPUs'}"
        )
        how = f"`{REPORT_COMMAND}` on {_machine_for(need)} (the gpu preset)"
    elif need and machine.gpus < need and not suspect:
        # nothing to show: say first what the machine lacks, then which data is missing
        have = "none" if machine.gpus == 0 else str(machine.gpus)
        why = f"needs {'a GPU' if need == 1 else f'{need} GPUs'} (this machine has {have}); {why}"
        how = f"`{REPORT_COMMAND}` on {_machine_for(need)} (the gpu preset)"
    elif need and machine.gpus < need:
        # its rows ran here and were flagged: that, not the machine, is why nothing is shown
        how = f"`{REPORT_COMMAND}` on {_machine_for(need)} (the gpu preset)"
    own = (ctx.get("coverage") or {}).get(part)
    if own and STATUS_ORDER.get(own.get("status"), 0) >= STATUS_ORDER[status]:
        status = own["status"]
        why = own.get("why", why)
        how = own.get("how", how)
    return status, why, how


def _lowered(status: str, why: str, how: str, facts: RunFacts, stage: str, part: str, ed: str):
    """The verdict lowered to `partly` where the stage's rows depart from the handout's protocol
    for this part, measured none of the model the handout names, or miss a value of the grid it
    asks (a partial answer gets these reasons beside its own)."""
    if status == "not":
        return status, why, how
    reasons = []
    if part in PROTOCOL_PARTS.get(stage, ()) and facts.deviations.get(stage):
        reasons.append(f"stage `{stage}` ran {facts.deviations[stage]}")
    asked, measured = model_asked(part, ed), facts.sizes.get(stage) or []
    if asked and measured and asked not in measured:
        reasons.append(
            f"stage `{stage}` measured {', '.join(measured)}; the handout asks the {asked} model"
        )
    missing = grid_missing(part, ed, facts.grids.get(stage, {}))
    if missing:
        gaps = "; ".join(f"{col} {', '.join(map(str, v))}" for col, v in missing.items())
        reasons.append(f"stage `{stage}` has no row that ran at {gaps} (the handout's grid)")
    if not reasons:
        return status, why, how
    how = how or f"`{REPORT_COMMAND}` with the gpu preset (its own grid)"
    return "partly", "; ".join([why, *reasons] if why else reasons), how


def tests_of_run(contexts: dict[str, dict]) -> pd.DataFrame | None:
    """The run's test rows (the kernel_tests stage's context: file, name, outcome), or None
    where the stage is not in the run or has no rows."""
    rows = (contexts.get("kernel_tests") or {}).get("tests")
    return rows if isinstance(rows, pd.DataFrame) and len(rows) else None


def part_tests(part: dict, rows: pd.DataFrame | None) -> dict[str, int] | None:
    """How the run's tests of a code part ended ({outcome: count}), from the rows of its test
    files whose `file::name` matches the part's `match`; None where none of them ran."""
    if rows is None:
        return None
    mine = rows[rows["file"].isin(part_test_files(part))]
    if part.get("match"):
        ids = mine["file"].astype(str) + "::" + mine["name"].astype(str)
        mine = mine[ids.map(lambda t: re.search(part["match"], t) is not None)]
    if not len(mine):
        return None
    counts = mine["outcome"].value_counts()
    return {o: int(counts.get(o, 0)) for o in OUTCOMES}


def _code_row(part: dict, contexts: dict[str, dict]) -> dict:
    """A code part: where it lives and how its tests ended in this run."""
    counts = part_tests(part, tests_of_run(contexts))
    pytest = f"`uv run pytest {' '.join(part_test_files(part))}`"
    where = f"`{part['code']}`"
    if counts is None:
        ran = "kernel_tests" in contexts
        why = (
            "the kernel_tests stage ran none of its tests (its `files` or `select` leave them out)"
            if ran
            else "the kernel_tests stage is not in this run"
        )
        return {"status": "not run", "answered in": where, "why": why, "what answers it": pytest}
    text = ", ".join(f"{n} {o}" for o, n in counts.items() if n or o in ("passed", "failed"))
    bad = counts["failed"] + counts["error"]
    status = "failed" if bad else ("passed" if counts["passed"] else "not run")
    why = (
        f"{bad} of its tests failed (the Kernel tests section lists them)"
        if bad
        else ("every test of it was skipped on this machine" if not counts["passed"] else "")
    )
    return {
        "status": status,
        "answered in": f"{where}; its tests in this run ([Kernel tests](#kernel_tests)): {text}",
        "why": why,
        "what answers it": pytest if why else "",
    }


def _part_link(part: dict) -> str:
    return f"[{label(part)}](#{ANCHOR_PREFIX}{anchor(part)})"


def _answer_link(part: dict, stages: list[str], ran: set[str]) -> str:
    """Where the part is answered: a link to each stage's section that this report has; a
    stage the run left out is named without one (its section is not in this report)."""
    if not part.get("answer"):
        return "–"
    q = part["answer"]
    linked = [f"[{st}](#{st})" for st in stages if st in ran]
    where = ", ".join(linked or [f"`{st}` (not in this run)" for st in stages]) or "–"
    return f"Q{q} ({ANSWERS[q]}) in {where}"


def _answer_row(part, stages, declared, contexts, machine, facts, edition) -> dict:
    """A part that asks for an answer: the best verdict of the stages that declare it."""
    pid = part["id"]
    if not stages:
        return {
            "status": "not",
            "answered in": "–",
            "why": "no stage of this commit answers it yet",
            "what answers it": "a stage that declares it (docs/CONVENTIONS.md)",
        }
    verdicts = []
    for st in stages:
        v = _verdict(st, declared[st][pid], contexts.get(st), machine, pid,
                     facts.suspects.get(st, 0))  # fmt: skip
        verdicts.append((st, *_lowered(*v, facts, st, pid, edition)))
    status = min(verdicts, key=lambda v: STATUS_ORDER[v[1]])[1]
    reasons = [v for v in verdicts if v[1] != "answered"] if status != "answered" else []
    return {
        "status": status,
        "answered in": _answer_link(part, stages, set(contexts)),
        # each reason once: two stages on one machine give the same one
        "why": "; ".join(dict.fromkeys(r for v in reasons for r in v[2].split("; ") if r)),
        "what answers it": "; ".join(dict.fromkeys(v[3] for v in reasons if v[3])),
    }


def coverage_table(
    edition: str,
    declared: dict[str, dict[str, dict]],
    contexts: dict[str, dict],
    machine: Machine,
    suspects: dict[str, int] | None = None,
    facts: RunFacts | None = None,
) -> pd.DataFrame:
    """One row per part of `edition` (the handout's and the questions beside them): its status
    on this machine, where the report answers it, why it is not (fully) answered and what
    answers it. `declared` holds every stage's QUESTIONS (whether or not it ran), `contexts` the
    report contexts of the stages that ran, `facts` what their rows say (`suspects`: the same
    as `facts.suspects`). A code part's status is its tests' in this run."""
    facts = facts or RunFacts()
    if suspects:
        facts = RunFacts({**facts.suspects, **suspects}, facts.deviations, facts.sizes, facts.grids)
    rows = []
    for part in edition_parts(edition):
        stages = [st for st, qs in sorted(declared.items()) if part["id"] in qs]
        row = {"part": _part_link(part), "kind": part["kind"], "deliverable": part["deliverable"]}
        if part["kind"] == "code":
            rows.append({**row, **_code_row(part, contexts)})
        else:
            rows.append(
                {**row, **_answer_row(part, stages, declared, contexts, machine, facts, edition)}
            )
    return pd.DataFrame(rows)


def handout_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the handout's problems' parts (written and code): the handout's count."""
    return table[table["kind"].isin(HANDOUT_KINDS)].reset_index(drop=True) if len(table) else table


def own_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the questions beside the handout's problems (optional, the study's own)."""
    return table[~table["kind"].isin(HANDOUT_KINDS)].reset_index(drop=True) if len(table) else table


def summary(table: pd.DataFrame) -> dict[str, int]:
    """Counts over the handout's parts only: `parts` (its own count), `measured` (those asking
    for answers) by status (`answered`, `partly`, `not`), `code` (implementations) by their
    tests' result (`code_passed`, `code_failed`, `code_not_run`); `own`: the questions beside
    them, listed apart, by status (`own_answered`, `own_partly`, `own_not`)."""
    handout, own = handout_rows(table), own_rows(table)
    kinds = handout["kind"] if len(handout) else pd.Series(dtype=str)
    answers = handout[kinds != "code"] if len(handout) else handout
    code = handout[kinds == "code"] if len(handout) else handout
    counts = answers["status"].value_counts().to_dict() if len(answers) else {}
    out = {k: int(counts.get(k, 0)) for k in STATUS_ORDER}
    out["parts"] = len(handout)
    out["code"] = len(code)
    out["measured"] = len(answers)
    code_counts = code["status"].value_counts().to_dict() if len(code) else {}
    for k in CODE_ORDER:
        out[f"code_{k.replace(' ', '_')}"] = int(code_counts.get(k, 0))
    own_counts = own["status"].value_counts().to_dict() if len(own) else {}
    out["own"] = len(own)
    for k in STATUS_ORDER:
        out[f"own_{k}"] = int(own_counts.get(k, 0))
    return out


def appendix(edition: str) -> str:
    """The edition's parts as the handout asks them, one list item per problem, each with the
    anchor the coverage table links to: the report's own copy of docs/questions.md's lines."""
    lines = []
    parts = edition_parts(edition)
    for problem in dict.fromkeys(p["problem"] for p in parts):
        mine = [p for p in parts if p["problem"] == problem]
        name = "the study's own questions" if problem == "ours" else f"`{problem}`"
        text = " ".join(
            f"({p['part']}) " * bool(p["part"]) + f"{p['ask']} _Deliverable: {p['deliverable']}"
            f"{' (code)' if p['kind'] == 'code' else ''}._"
            for p in mine
        )
        lines += [
            f'<a id="{ANCHOR_PREFIX}{anchor(mine[0])}"></a>',
            f"- **{name}** (handout sections 2025 / 2026: {SECTIONS.get(problem, '–')}). {text}",
            "",
        ]
    return "\n".join(lines).rstrip() + "\n"
