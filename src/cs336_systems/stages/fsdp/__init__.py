"""Stage `fsdp`: fully sharded data parallel against DDP and optimizer-state sharding: memory per
rank, time per step, communication and how much of the weight all-gathers compute hides.

`python -m cs336_systems.stages.fsdp` measures (see measure.py); analysis.py turns the CSV into
figures and the report's sentences. Keep this file free of heavy imports: the workflow reads it
while planning.
"""

TITLE = "Fully sharded data parallel (FSDP)"
# where the section sits in the report (ascending): right after DDP
ORDER = 105

# the parts of docs/questions.md this stage answers and how the report tells (reporting/coverage.py)
QUESTIONS = {
    "fsdp_accounting.a": {"evidence": ["q32"], "needs": "gpus:2"},
    "fsdp_accounting.b": {"evidence": ["q33"], "needs": "gpus:2"},
}

# the step and its compute phases must not be dominated by an outlier; the sync after backward
# is a wait for the last collectives, near zero in most steps and the collective's length in a
# few (a skewed wait, whose std above its mean is what such a wait looks like, not an error)
SANITY = {
    "fsdp": [{"kind": "std_above_mean", "columns": r"^(step|fwd|bwd|opt)_ms_std$"}],
}
