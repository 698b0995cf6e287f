"""Stage `arithmetic`: the 2026 handout's communication arithmetic (section 8) for one SwiGLU
FFN, evaluated for the handout's B200 and for this machine's measured matmul peak and bus
bandwidth, with the ring all-reduce time model checked against the all-reduce stage's times;
and the 2025 handout's communication accounting of the XXL model on TPU v5p (section 2.4); and
memory_profiling (d), one residual-stream activation of the model the edition's handout names.

`python -m cs336_systems.stages.arithmetic` computes (see measure.py; the formulas are in
core/costs.py); analysis.py turns the CSV into the report's sentences; plan.py holds what the
workflow needs to plan the stage's job. Keep this file free of heavy imports: the workflow reads
it while planning.
"""

TITLE = "Communication arithmetic"
# where the section sits in the report (ascending): after DDP (100) and FSDP (105)
ORDER = 110

# the parts of docs/questions.md this stage answers and how the report tells (reporting/coverage.py);
# analytic: no GPU needed for the B200 answers (the measured case says what it lacks)
QUESTIONS = {
    "alternate_ring_all_reduce": {"evidence": ["q34"]},
    "data_parallel_calcs.a": {"evidence": ["q35"]},
    "data_parallel_calcs.b": {"evidence": ["q35"]},
    "data_parallel_calcs.c": {"evidence": ["q35"]},
    "fsdp_calcs.a": {"evidence": ["q35"]},
    "fsdp_calcs.b": {"evidence": ["q35"]},
    "fsdp_calcs.c": {"evidence": ["q35"]},
    "tp_calcs.a": {"evidence": ["q35"]},
    "tp_calcs.b": {"evidence": ["q35"]},
    "tp_calcs.c": {"evidence": ["q35"]},
    "tp_calcs.d": {"evidence": ["q35"]},
    "fsdp_tp_calcs.a": {"evidence": ["q36"]},
    "fsdp_tp_calcs.b": {"evidence": ["q36"]},
    "fsdp_tp_calcs.c": {"evidence": ["q36"]},
    "fsdp_tp_calcs.d": {"evidence": ["q36"]},
    "communication_accounting.a": {"evidence": ["q38.a"]},
    "communication_accounting.b": {"evidence": ["q38.b"]},
    "communication_accounting.c": {"evidence": ["q38.c"]},
    "communication_accounting.d": {"evidence": ["q38.d"]},
    # derived for the model the edition's handout names (its rows carry its `size`): no GPU
    "memory_profiling.d": {"evidence": ["q16"]},
}
