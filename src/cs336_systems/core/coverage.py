"""Which questions of the study a run answers: answered, partly or not on this machine, and why.

The questions are those of QUESTIONS.md (numbered as there; 1-27 in both editions, 28-37 in
2026 only). A stage says which questions it answers, and how to tell, by declaring data in its
package's `__init__.py` (no imports needed)::

    QUESTIONS = {
        4: {"evidence": ["mfu_best", "mfu_table"], "needs": "gpu"},
    }

- ``evidence``: keys of the stage's report context (dotted for nested dicts) that hold the
  answer: all present and non-empty → answered; some → partly; none → not answered.
- ``needs``: ``"gpu"`` (the question is about a GPU: on a CPU run the stage's numbers describe
  the CPU, so the answer is partial) or ``"gpus:N"`` (N GPUs of one host).
- a stage's context may also return ``coverage = {q: {"status": "partly", "why": "..."}}`` for
  what only its data can tell (a status there can lower, never raise, the verdict).

`coverage_table` turns the declarations, the run's contexts (and how many suspect rows each
stage left out) and the machine into one row per question with the reason and the command or
machine that answers it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

EDITIONS = ("2025", "2026")

# number -> (short title, editions that ask it); the text of each is in QUESTIONS.md
QUESTIONS: dict[int, tuple[str, tuple[str, ...]]] = {
    1: ("Forward, backward and optimizer-step latency per size and context", EDITIONS),
    2: ("Warm-up steps: mean, spread, and why the first step costs more", EDITIONS),
    3: ("bf16 autocast and torch.compile speedups", EDITIONS),
    4: ("Achieved TFLOP/s and MFU against the measured peak", EDITIONS),
    5: ("Forward time under the profiler vs the harness", EDITIONS),
    6: ("The kernel with the most GPU time in forward (and forward+backward)", EDITIONS),
    7: ("Non-matmul kernels with a non-trivial share of forward", EDITIONS),
    8: ("GEMM share: training step vs forward", EDITIONS),
    9: ("Softmax vs the matmuls inside attention, against their FLOPs", EDITIONS),
    10: ("Accumulating 0.01 a thousand times in fp32/fp16/bf16", EDITIONS),
    11: ("Autocast dtypes of the toy model", EDITIONS),
    12: ("Layer normalization in low precision", EDITIONS),
    13: ("Memory timelines of forward and a training step", EDITIONS),
    14: ("Peak memory per context length", EDITIONS),
    15: ("Mixed precision and peak memory", EDITIONS),
    16: ("Residual-stream activation size, derived and measured", EDITIONS),
    17: ("The largest allocations and where they come from", EDITIONS),
    18: ("Attention: time, memory before backward, out-of-memory points", EDITIONS),
    19: ("torch.compile on attention and on the whole model", EDITIONS),
    20: ("FlashAttention-2 (Triton) vs PyTorch: latency, TFLOP/s, tiles", EDITIONS),
    21: ("The FlashAttention leaderboard configuration vs SDPA", EDITIONS),
    22: ("All-reduce time and bandwidth over sizes and world sizes", EDITIONS),
    23: ("Naive DDP: step time and communication share", EDITIONS),
    24: ("DDP with one flattened all-reduce", EDITIONS),
    25: ("DDP overlapping communication with backward", EDITIONS),
    26: ("Bucketed DDP and the bucket-size model", EDITIONS),
    27: ("Optimizer-state sharding: memory and time", EDITIONS),
    28: ("Memory saved for backward by one TransformerBlock", ("2026",)),
    29: ("Saved tensors of RMSNorm and an xl block, eager and compiled", ("2026",)),
    30: ("The memory-optimal nested checkpointing strategy", ("2026",)),
    31: ("One level of checkpointing on xl: best block size and peaks", ("2026",)),
    32: ("FSDP's memory saving against optimizer-state sharding", ("2026",)),
    33: ("FSDP on two GPUs: does the all-gather finish in time", ("2026",)),
    34: ("The alternate ring all-reduce's time in S, N, W", ("2026",)),
    35: ("Data-, fully sharded- and tensor-parallel FFN: FLOPs and communication", ("2026",)),
    36: ("2-D FSDP x TP: FLOPs, communication, largest device count", ("2026",)),
    37: ("The 8B full-step leaderboard on two GPUs", ("2026",)),
}
STATUS_ORDER = {"answered": 0, "partly": 1, "not": 2}
REPORT_COMMAND = "snakemake --cores 1 report"


def edition_questions(edition: str) -> list[int]:
    if edition not in EDITIONS:
        raise ValueError(f"unknown edition {edition!r}; known: {EDITIONS}")
    return [q for q, (_, eds) in QUESTIONS.items() if edition in eds]


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
    stage: str, spec: dict, ctx: dict | None, machine: Machine, q: int, n_suspect: int = 0
):
    """(status, why, how) of one stage's answer to question q."""
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
    if status != "answered":
        missing = [k for k in evidence if k not in have]
        why = f"stage `{stage}` has no data for {', '.join(f'`{m}`' for m in missing)}"
        if n_suspect:
            why += f" ({n_suspect} suspect row{'s' if n_suspect > 1 else ''} left out)"
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
    elif need and machine.gpus < need:
        # nothing to show: say first what the machine lacks, then which data is missing
        have = "none" if machine.gpus == 0 else str(machine.gpus)
        why = f"needs {'a GPU' if need == 1 else f'{need} GPUs'} (this machine has {have}); {why}"
        how = f"`{REPORT_COMMAND}` on {_machine_for(need)} (the gpu preset)"
    own = (ctx.get("coverage") or {}).get(q)
    if own and STATUS_ORDER.get(own.get("status"), 0) >= STATUS_ORDER[status]:
        status = own["status"]
        why = own.get("why", why)
        how = own.get("how", how)
    return status, why, how


def coverage_table(
    edition: str,
    declared: dict[str, dict[int, dict]],
    contexts: dict[str, dict],
    machine: Machine,
    suspects: dict[str, int] | None = None,
) -> pd.DataFrame:
    """One row per question of `edition`: its status on this machine, the stage(s) that answer
    it, why it is not (fully) answered and what answers it. `declared` holds every stage's
    QUESTIONS (whether or not it ran), `contexts` the report contexts of the stages that ran."""
    rows = []
    for q in edition_questions(edition):
        title = QUESTIONS[q][0]
        stages = [st for st, qs in sorted(declared.items()) if q in qs]
        if not stages:
            rows.append(
                {
                    "Q": q,
                    "question": title,
                    "status": "not",
                    "stages": "–",
                    "why": "no stage of this commit answers it yet",
                    "what answers it": "a stage that declares it (docs/CONVENTIONS.md)",
                }
            )
            continue
        verdicts = [
            (
                st,
                *_verdict(
                    st, declared[st][q], contexts.get(st), machine, q, (suspects or {}).get(st, 0)
                ),
            )
            for st in stages
        ]
        best = min(verdicts, key=lambda v: STATUS_ORDER[v[1]])
        status = best[1]
        reasons = [v for v in verdicts if v[1] != "answered"]
        rows.append(
            {
                "Q": q,
                "question": title,
                "status": status,
                "stages": ", ".join(f"`{st}`" for st in stages),
                "why": "; ".join(v[2] for v in reasons if v[2]) if status != "answered" else "",
                "what answers it": "; ".join(dict.fromkeys(v[3] for v in reasons if v[3]))
                if status != "answered"
                else "",
            }
        )
    return pd.DataFrame(rows)


def summary(table: pd.DataFrame) -> dict[str, int]:
    counts = table["status"].value_counts().to_dict() if len(table) else {}
    return {k: int(counts.get(k, 0)) for k in STATUS_ORDER}
