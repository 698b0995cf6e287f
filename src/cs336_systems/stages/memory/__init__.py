"""Stage `memory`: CUDA memory snapshots of one step: timelines, peaks, largest allocations, activation model.

`python -m cs336_systems.stages.memory` measures (see measure.py); analysis.py turns the CSVs into
figures and the report's sentences; plan.py (where present) holds what the workflow needs to plan
the stage's jobs. Keep this file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "Memory"
# where the section sits in the report (ascending)
ORDER = 60
