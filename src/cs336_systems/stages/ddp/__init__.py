"""Stage `ddp`: DDP variants and optimizer-state sharding: time per step, communication, memory.

`python -m cs336_systems.stages.ddp` measures (see measure.py); analysis.py turns the CSVs into
figures and the report's sentences; plan.py (where present) holds what the workflow needs to plan
the stage's jobs. Keep this file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "Data-parallel training and optimizer-state sharding"
# where the section sits in the report (ascending)
ORDER = 100
