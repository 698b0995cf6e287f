"""Stage `kernel_tests`: FlashAttention-2 kernel tests (PyTorch and Triton) run as a stage; their
verdicts gate the flash benchmarks. It also runs the tests of the handout's other code parts (the
benchmarking script, DDP, the sharded optimizer, FSDP): the report's coverage table gives each
code part the result of its tests in this run (reporting/coverage.py: part_tests).

`python -m cs336_systems.stages.kernel_tests` measures (see measure.py); analysis.py turns the CSVs into
figures and the report's sentences; plan.py (where present) holds what the workflow needs to plan
the stage's jobs. Keep this file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "Kernel tests"
# where the section sits in the report (ascending)
ORDER = 10

# no QUESTIONS: the handout's code parts are counted from this stage's test rows by the
# coverage table itself (each part names its tests in reporting/questions.py)
