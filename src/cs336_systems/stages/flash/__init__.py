"""Stage `flash`: Our FlashAttention-2 (PyTorch, Triton) against naive attention and PyTorch SDPA backends.

`python -m cs336_systems.stages.flash` measures (see measure.py); analysis.py turns the CSVs into
figures and the report's sentences; plan.py (where present) holds what the workflow needs to plan
the stage's jobs. Keep this file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "FlashAttention-2"
# where the section sits in the report (ascending)
ORDER = 80
