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

`coverage_table` turns the declarations, the run's contexts (and how many suspect rows each
stage left out) and the machine into one row per part with the reason and the command or
machine that answers it. A `code` part (an implementation) is listed with where it lives and
the tests that check it: the pytest suite, not the run, answers it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from cs336_systems.reporting.questions import ANSWERS, BY_ID, anchor, edition_parts, label

STATUS_ORDER = {"answered": 0, "partly": 1, "not": 2}
REPORT_COMMAND = "snakemake --cores 1 report"
# the list the coverage table links to, from report/<machine>/report.md
QUESTIONS_DOC = "../../docs/questions.md"


def edition_questions(edition: str) -> list[str]:
    """The part ids of `edition`, in the handout's order."""
    return [p["id"] for p in edition_parts(edition)]


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
        f"{n_suspect} of its measured row{'s' if n_suspect > 1 else ''} ran but failed a sanity "
        "check and {} left out (the section's Suspect numbers)".format(
            "are" if n_suspect > 1 else "is"
        )
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


def _part_link(part: dict) -> str:
    return f"[{label(part)}]({QUESTIONS_DOC}#{anchor(part)})"


def _answer_link(part: dict, stages: list[str], ran: set[str]) -> str:
    """Where the part is answered: a link to each stage's section that this report has; a
    stage the run left out is named without one (its section is not in this report)."""
    if part["kind"] == "code":
        run = ", ".join(f"[{st}](#{st})" if st in ran else f"`{st}`" for st in stages)
        return f"`{part['code']}`" + (f" (its tests run in {run})" if run else "")
    if not part.get("answer"):
        return "–"
    q = part["answer"]
    linked = [f"[{st}](#{st})" for st in stages if st in ran]
    where = ", ".join(linked or [f"`{st}` (not in this run)" for st in stages]) or "–"
    return f"Q{q} ({ANSWERS[q]}) in {where}"


def coverage_table(
    edition: str,
    declared: dict[str, dict[str, dict]],
    contexts: dict[str, dict],
    machine: Machine,
    suspects: dict[str, int] | None = None,
) -> pd.DataFrame:
    """One row per part of `edition`: its status on this machine, where the report answers it,
    why it is not (fully) answered and what answers it. `declared` holds every stage's
    QUESTIONS (whether or not it ran), `contexts` the report contexts of the stages that ran.
    A `code` part's status is `code`: it names the implementation and its tests."""
    rows = []
    for pid in edition_questions(edition):
        part = BY_ID[pid]
        stages = [st for st, qs in sorted(declared.items()) if pid in qs]
        row = {
            "part": _part_link(part),
            "kind": part["kind"],
            "deliverable": part["deliverable"],
        }
        if part["kind"] == "code" and not stages:
            rows.append(
                {
                    **row,
                    "status": "code",
                    "answered in": f"`{part['code']}`",
                    "why": "",
                    "what answers it": f"`uv run pytest {part['tests']}`",
                }
            )
            continue
        if not stages:
            rows.append(
                {
                    **row,
                    "status": "not",
                    "answered in": "–",
                    "why": "no stage of this commit answers it yet",
                    "what answers it": "a stage that declares it (docs/CONVENTIONS.md)",
                }
            )
            continue
        verdicts = [
            (
                st,
                *_verdict(
                    st, declared[st][pid], contexts.get(st), machine, pid,
                    (suspects or {}).get(st, 0),
                ),
            )
            for st in stages
        ]  # fmt: skip
        best = min(verdicts, key=lambda v: STATUS_ORDER[v[1]])
        status = best[1]
        reasons = [v for v in verdicts if v[1] != "answered"]
        rows.append(
            {
                **row,
                "status": status,
                "answered in": _answer_link(part, stages, set(contexts)),
                "why": "; ".join(v[2] for v in reasons if v[2]) if status != "answered" else "",
                "what answers it": "; ".join(dict.fromkeys(v[3] for v in reasons if v[3]))
                if status != "answered"
                else "",
            }
        )
    return pd.DataFrame(rows)


def summary(table: pd.DataFrame) -> dict[str, int]:
    """How many parts ask for answers (`measured`) and how many of those have each status;
    how many ask for code (`code`: an implementation, whether or not a stage runs its tests);
    `parts` their number in all."""
    kinds = table["kind"] if len(table) else pd.Series(dtype=str)
    answers = table[kinds != "code"] if len(table) else table
    counts = answers["status"].value_counts().to_dict() if len(answers) else {}
    out = {k: int(counts.get(k, 0)) for k in STATUS_ORDER}
    out["parts"] = len(table)
    out["code"] = int((kinds == "code").sum())
    out["measured"] = len(answers)
    return out
