"""Stage `attention`: Naive attention eager and compiled over head dim and sequence length: time and memory.

`python -m cs336_systems.stages.attention` measures (see measure.py); analysis.py turns the CSVs into
figures and the report's sentences; plan.py (where present) holds what the workflow needs to plan
the stage's jobs. Keep this file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "Attention"
# where the section sits in the report (ascending)
ORDER = 70

# the questions of QUESTIONS.md this stage answers and how the report tells (core/coverage.py)
QUESTIONS = {
    18: {"evidence": ["timing_table"], "needs": "gpu"},
    19: {"evidence": ["compile.available", "model_compile.available"], "needs": "gpu"},
}

