"""Stage `benchmark`: End-to-end latency of the model over size, context, precision and compilation; warm-up sweep.

`python -m cs336_systems.stages.benchmark` measures (see measure.py); analysis.py turns the CSVs into
figures and the report's sentences; plan.py (where present) holds what the workflow needs to plan
the stage's jobs. Keep this file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "End-to-end benchmarks"
# where the section sits in the report (ascending)
ORDER = 30
