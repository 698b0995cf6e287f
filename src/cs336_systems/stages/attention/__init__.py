"""Stage `attention`: Naive attention eager and compiled over head dim and sequence length: time and memory.

`python -m cs336_systems.stages.attention` measures (see measure.py); analysis.py turns the CSVs into
figures and the report's sentences; plan.py (where present) holds what the workflow needs to plan
the stage's jobs. Keep this file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "Attention"
# where the section sits in the report (ascending)
ORDER = 70

# the parts of docs/questions.md this stage answers and how the report tells (reporting/coverage.py)
QUESTIONS = {
    "pytorch_attention.a": {"evidence": ["timing_table"], "needs": "gpu"},
    "torch_compile.a": {"evidence": ["compile.available"], "needs": "gpu"},
    "torch_compile.b": {"evidence": ["model_compile.available"], "needs": "gpu"},
}

# the numbers the comparison report puts side by side across machines (reporting/compare.py)
COMPARE = {
    "attention": {
        "keys": ["impl", "d_head", "seq_len"],
        "values": {"fwd_ms_mean": "fwd ms", "bwd_ms_mean": "bwd ms"},
    },
}
