"""A model of one's own through the pipeline (docs/own-model.md): one config key adds it to the
benchmark's and the memory stage's grids on the tiny config, its rows carry its name and where
its FLOPs come from, and the report renders them; a bad factory stops the run before any job,
naming the key."""

from __future__ import annotations

import pandas as pd
from pipeline_utils import TINY_RUN, copy_run, snakemake

NAME = "conv-lm"
OWN = f'own_model={{name: {NAME}, factory: "cs336_systems.models.examples:conv_lm"}}'
RESULTS = "results/tiny-test"
# its benchmark point and memory job, and the report: the finished run's other jobs stay as
# they were (the memory stage runs the own model alone)
TARGETS = [f"{RESULTS}/benchmark/points/{NAME}_ctx16_naive.csv", f"{RESULTS}/memory/{NAME}.csv"]
REPORT = "report/tiny-test/report.md"
MEMORY_OWN_ONLY = f"memory={{cpu: {{sizes: [{NAME}]}}}}"


def test_own_model_rows_in_benchmark_and_memory(finished_tiny_run, tmp_path):
    run = copy_run(finished_tiny_run, tmp_path / "run")
    stages = "stages=[ceilings,benchmark,memory]"
    snakemake(run, *TARGETS, REPORT, *TINY_RUN, stages, OWN, MEMORY_OWN_ONLY)
    bench = pd.read_csv(run / TARGETS[0])
    assert set(bench["size"]) == {NAME}
    assert set(bench["status"]) == {"ok"}
    assert set(bench["flops_source"]) == {"counted"}
    assert set(bench["mode"]) == {"forward", "forward_backward", "train_step"}
    fwd, fb = (
        bench.set_index("mode").loc[m, "flops_per_step"] for m in ("forward", "forward_backward")
    )
    assert 2.5 * fwd < fb < 3.5 * fwd  # counted: a backward about twice a forward
    memory = pd.read_csv(run / TARGETS[1])
    assert set(memory["size"]) == {NAME} and (memory["status"] == "ok").all()
    assert (memory["checkpoint"] == "none").all()  # no blocks to checkpoint by the analytic best
    blocks = pd.read_csv(run / f"{RESULTS}/memory/{NAME}.blocks.csv")
    assert blocks["status"].str.startswith("skipped: part (f)").all()
    # the report: the sections render its rows, saying where its FLOPs come from
    report = (run / REPORT).read_text()
    assert report.count(f"Own model **{NAME}**") == 2  # the benchmark's and memory's sections
    assert "FLOPs counted" in report


def test_a_bad_factory_stops_the_run_naming_the_key(finished_tiny_run, tmp_path):
    run = copy_run(finished_tiny_run, tmp_path / "run")
    bad = 'own_model={name: mine, factory: "cs336_systems.model:VOCAB_SIZE"}'
    proc = snakemake(run, "-n", *TINY_RUN, bad, check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "own_model.factory" in out and "naming a callable" in out
