"""Shared machinery every stage uses: timing harness, results and provenance, cost formulas,
device helpers, the model workload, phase ranges, logging and CLI pieces.

Imports nothing from `parallel`, `profiling` or `stages`; keep this file free of imports so that
the workflow can import `core` modules without loading torch.
"""
