"""Stage `checkpointing`: what autograd saves for backward, and what activation checkpointing buys.

`python -m cs336_systems.stages.checkpointing` measures (see measure.py): `accounting` lists the
tensors one RMSNorm and one TransformerBlock save, eager and compiled; `strategies` measures the
peak memory and step time of a training step under each checkpointing strategy
(core/checkpoint_plans.py: whole blocks, nested, and the halves of a block) beside the analytic
model (core/costs.py; sub_block.py for the halves). analysis.py turns the CSVs
into figures and the report's sentences; plan.py checks the config for the workflow. Keep this
file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "Activation checkpointing"
# where the section sits in the report (ascending)
ORDER = 65

# the parts of docs/questions.md this stage answers and how the report tells (reporting/coverage.py)
QUESTIONS = {
    "ours.saved_tensors": {"evidence": ["accounting.shape"]},
    "gradient_checkpointing.a": {"evidence": ["sketch", "nested"]},
    "gradient_checkpointing.b": {"evidence": ["best"], "needs": "gpu"},
}
