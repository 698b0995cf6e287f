"""Stage `allreduce`: All-reduce time and bandwidth over backends, world sizes and message sizes.

`python -m cs336_systems.stages.allreduce` measures (see measure.py); analysis.py turns the CSVs into
figures and the report's sentences; plan.py (where present) holds what the workflow needs to plan
the stage's jobs. Keep this file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "Distributed communication"
# where the section sits in the report (ascending)
ORDER = 90

# the parts of docs/questions.md this stage answers and how the report tells (reporting/coverage.py)
QUESTIONS = {
    "distributed_communication_single_node": {"evidence": ["tables"], "needs": "gpus:6"},
}

# the numbers the comparison report puts side by side across machines (reporting/compare.py)
COMPARE = {
    "allreduce": {
        "keys": ["backend", "buffers", "world_size", "size_mb"],
        "values": {"time_ms_median": "ms", "busbw_gbps": "busbw GB/s"},
        "headlines": [
            {
                "label": "best bus bandwidth, gloo (GB/s)",
                "column": "busbw_gbps",
                "agg": "max",
                "where": {"backend": "gloo"},
            },
            {
                "label": "best bus bandwidth, NCCL (GB/s)",
                "column": "busbw_gbps",
                "agg": "max",
                "where": {"backend": "nccl"},
            },
        ],
    },
}
