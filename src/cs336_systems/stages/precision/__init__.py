"""Stage `precision`: Accumulation in low precision, autocast dtypes of a toy model, layer norm's sensitivity.

`python -m cs336_systems.stages.precision` measures (see measure.py); analysis.py turns the CSVs into
figures and the report's sentences; plan.py (where present) holds what the workflow needs to plan
the stage's jobs. Keep this file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "Mixed precision"
# where the section sits in the report (ascending)
ORDER = 50

# the parts of docs/questions.md this stage answers and how the report tells (reporting/coverage.py)
QUESTIONS = {
    "mixed_precision_accumulation": {"evidence": ["accumulation.table"]},
    "benchmarking_mixed_precision.a": {"evidence": ["dtypes.table"], "needs": "gpu"},
    "benchmarking_mixed_precision.b": {"evidence": ["layernorm.table"]},
}
