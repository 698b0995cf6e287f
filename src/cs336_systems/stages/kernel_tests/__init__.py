"""Stage `kernel_tests`: FlashAttention-2 kernel tests (PyTorch and Triton) run as a stage; their verdicts gate the flash benchmarks.

`python -m cs336_systems.stages.kernel_tests` measures (see measure.py); analysis.py turns the CSVs into
figures and the report's sentences; plan.py (where present) holds what the workflow needs to plan
the stage's jobs. Keep this file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "Kernel tests"
# where the section sits in the report (ascending)
ORDER = 10

# the parts of docs/questions.md this stage answers and how the report tells (reporting/coverage.py)
QUESTIONS = {
    "flash_forward.a": {"evidence": ["verdicts.flash_pytorch"]},
    "flash_forward.b": {"evidence": ["verdicts.flash_triton"]},
    "flash_forward.c": {"evidence": ["verdicts.flash_triton"]},
    "flash_backward": {"evidence": ["verdicts.flash_pytorch", "verdicts.flash_triton"]},
}
