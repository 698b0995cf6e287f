"""Stage `memory`: CUDA memory snapshots of one step: timelines, peaks, largest allocations, activation model.

`python -m cs336_systems.stages.memory` measures (see measure.py); analysis.py turns the CSVs into
figures and the report's sentences; plan.py (where present) holds what the workflow needs to plan
the stage's jobs. Keep this file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "Memory"
# where the section sits in the report (ascending)
ORDER = 60

# the parts of docs/questions.md this stage answers and how the report tells (reporting/coverage.py)
QUESTIONS = {
    "memory_profiling.a": {"evidence": ["timelines"], "needs": "gpu"},
    "memory_profiling.b": {"evidence": ["peak_table"], "needs": "gpu"},
    "memory_profiling.c": {"evidence": ["precision_sentence"], "needs": "gpu"},
    "memory_profiling.d": {
        "evidence": ["handout_residual_sentence", "residual_sentence", "activation_sentence"]
    },
    "memory_profiling.e": {"evidence": ["alloc_table", "alloc_sentence"], "needs": "gpu"},
    # what one block saves (hooks, any device), its Nsight capture and its gradients' size
    # from the allocator's changes (both CUDA): the handout's screenshots and calculation
    "memory_profiling.f": {
        "evidence": ["y2026.block_sentences", "y2026.nsys_ok", "y2026.allocator_grads"],
        "needs": "gpu",
    },
}
# numbers that cannot be right (reporting/sanity.py): a step's peak below the parameters it holds
SANITY = {
    "memory": [
        {
            "kind": "greater_than",
            "left": "params_mb",
            "right": "peak_allocated_mb",
            "why": "peak allocated memory below the parameters' own size",
        }
    ],
}

# the numbers the comparison report puts side by side across machines (reporting/compare.py)
COMPARE = {
    "memory": {
        "keys": ["size", "context_length", "mode", "precision", "checkpoint"],
        "values": {"saved_activations_mb": "saved MiB", "peak_allocated_mb": "peak MiB"},
        "headlines": [
            {
                "label": "largest activations saved for backward (MiB)",
                "column": "saved_activations_mb",
                "agg": "max",
            },
        ],
    },
}
