"""Measuring machinery every stage uses: the timing harness, results and provenance, FLOP and
communication formulas, device helpers, the model workload, phase ranges, CUDA graphs and
checkpointing plans.

Above `planning`, below `kernels`, `parallel`, `profiling`, `engine` and the stages. Keep this
file free of imports so that importing one module does not import the others.
"""
