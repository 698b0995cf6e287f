"""Stage `fsdp`: fully sharded data parallel against DDP and optimizer-state sharding: memory per
rank, time per step, communication and how much of the weight all-gathers compute hides.

`python -m cs336_systems.stages.fsdp` measures (see measure.py); analysis.py turns the CSV into
figures and the report's sentences. Keep this file free of heavy imports: the workflow reads it
while planning.
"""

TITLE = "Fully sharded data parallel (FSDP)"
# where the section sits in the report (ascending): right after DDP
ORDER = 105
