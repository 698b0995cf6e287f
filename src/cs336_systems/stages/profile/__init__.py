"""Stage `profile`: Nsight Systems or torch.profiler captures: kernels per phase, GEMM share, attention's parts.

`python -m cs336_systems.stages.profile` measures (see measure.py); analysis.py turns the CSVs into
figures and the report's sentences; plan.py (where present) holds what the workflow needs to plan
the stage's jobs. Keep this file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "Profiling"
# where the section sits in the report (ascending)
ORDER = 40
