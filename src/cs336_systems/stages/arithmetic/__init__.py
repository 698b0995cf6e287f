"""Stage `arithmetic`: the 2026 handout's communication arithmetic (section 8) for one SwiGLU
FFN, evaluated for the handout's B200 and for this machine's measured matmul peak and bus
bandwidth, with the ring all-reduce time model checked against the all-reduce stage's times.

`python -m cs336_systems.stages.arithmetic` computes (see measure.py; the formulas are in
core/costs.py); analysis.py turns the CSV into the report's sentences; plan.py holds what the
workflow needs to plan the stage's job. Keep this file free of heavy imports: the workflow reads
it while planning.
"""

TITLE = "Communication arithmetic"
# where the section sits in the report (ascending): after DDP (100) and FSDP (105)
ORDER = 110

# the questions of QUESTIONS.md this stage answers and how the report tells (core/coverage.py);
# analytic: no GPU needed for the B200 answers (the measured case says what it lacks)
QUESTIONS = {
    34: {"evidence": ["q34"]},
    35: {"evidence": ["q35"]},
    36: {"evidence": ["q36"]},
}
