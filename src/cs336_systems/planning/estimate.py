"""What a stage's time estimate is made of: its jobs (`Job`), and what it may ask of the
machine's cost model (`Costs`, implemented by budget/model.py).

Each stage's plan module (`stages/<stage>/plan.py`) owns its estimate:

    def estimate(k: BenchmarkKnobs, at: Costs) -> list[Job]   # typed knobs in, seconds out
    ETA_KEYS = {"benchmark": lambda wc: f"{wc['size']} ctx{wc['ctx']} {wc['attention']}"}

`estimate` names one `Job` per job its rules plan; `ETA_KEYS` maps each of its measuring rules
to the name of the job a rule's job is (from its wildcards), so that the run's forecast
(budget/forecast.py) estimates every job it is about to run. The budget (budget/__init__.py)
discovers the stages as the config does and sums their jobs. Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class Job:
    """One job the rules plan: its stage, its name (what `ETA_KEYS` gives its rule's jobs), its
    estimated seconds and what they are made of, in words."""

    stage: str
    job: str
    seconds: float
    how: str
    parts: dict = field(default_factory=dict)


# rule name -> the job name of one of its jobs, from the job's wildcards
EtaKeys = dict[str, Callable[[dict], str]]


class Costs(Protocol):
    """The machine's cost model a stage's estimate reads (budget/model.py: `CostModel`).

    `dev` holds the machine's constants (budget/devices.py: `Device`: rates, a job's start, a
    compile, a capture, its GPUs and memory); `edition` the course edition whose model sizes the
    size names mean; `stages` the stages of the run (a job that reuses another's work, like
    the flash jobs the kernel tests' compiled kernels, costs less where that stage runs)."""

    dev: Any
    edition: int
    stages: tuple[str, ...]

    def layers(self, size: str) -> int:
        """The model size's number of transformer blocks."""

    def rate(self, precision: str) -> float:
        """FLOP/s a model step reaches in this precision."""

    def step_s(self, size: str, ctx: int, batch: int, mode: str, precision: str) -> float:
        """One model step's seconds: its FLOPs at the reached rate, or its launches."""

    def step_gib(self, size: str, ctx: int, batch: int, mode: str, precision: str) -> float:
        """One step's memory (state and saved activations), GiB."""

    def state_and_activations_gib(
        self, size: str, ctx: int, batch: int, precision: str
    ) -> tuple[float, float]:
        """A training step's state and saved activations apart, GiB."""

    def fits(self, gib: float, factor: float = 1.0) -> bool:
        """Whether `gib` fits `factor` times the device's memory (always, without a limit)."""

    def build_s(self, size: str, n: int = 1) -> float:
        """Building `n` models of this size on the device."""

    def compile_s(self, size: str) -> float:
        """torch.compile of one model shape in one precision."""

    def too_costly(
        self, size: str, ctx: int, batch: int, mode: str, precision: str, steps: int, limit
    ) -> bool:
        """The benchmark's cost guard: `steps` steps above `limit` seconds at the measured
        matmul rate (a `skipped` row, decided before allocating)."""

    def train_step_flops(
        self, vocab: int, d_model: int, layers: int, d_ff: int, batch: int, ctx: int
    ) -> float:
        """A training step's FLOPs of a model given by its widths (the leaderboard's)."""


def fixed_job(stage: str, at: Costs, how: str, job: str | None = None) -> Job:
    """A job whose cost the config does not scale: a job's start and the device's fixed seconds
    for it (`dev.fixed_s[job or stage]`)."""
    job = job or stage
    return Job(stage, job, at.dev.job_start_s + at.dev.fixed_s[job], how)


def world_jobs(stage: str, at: Costs, runs: list[tuple[str, str, list[int]]]) -> list[Job]:
    """One job per (name, backend, world sizes) of a distributed stage: NCCL on fewer GPUs than
    a world size is a status row at once; gloo runs on the host's cores (a world of processes,
    `dev.gloo_world_s` each)."""
    jobs = []
    for name, backend, worlds in runs:
        ran = [w for w in worlds if backend == "gloo" or w <= at.dev.gpus]
        how = f"{len(ran)} of {len(worlds)} world sizes run" + (
            "" if len(ran) == len(worlds) else f" (NCCL: {at.dev.gpus} GPUs here)"
        )
        # an NCCL world's steps on GPUs, measured per stage's job (`dev.nccl_world_s`)
        per = at.dev.gloo_world_s
        if backend == "nccl":
            per = getattr(at.dev, "nccl_world_s", {}).get(f"{stage}/{name}", per)
        jobs.append(Job(stage, name, at.dev.job_start_s + per * len(ran), how))
    return jobs
