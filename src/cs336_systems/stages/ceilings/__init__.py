"""Stage `ceilings`: This machine's matmul peaks and copy bandwidth: the denominators of every MFU figure.

`python -m cs336_systems.stages.ceilings` measures (see measure.py); analysis.py turns the CSVs into
figures and the report's sentences; plan.py (where present) holds what the workflow needs to plan
the stage's jobs. Keep this file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "Machine ceilings"
# where the section sits in the report (ascending)
ORDER = 20

# the numbers the comparison report puts side by side across machines (reporting/compare.py)
COMPARE = {
    "ceilings": {
        "keys": ["kind", "dtype", "path"],
        # the best of a (dtype, path)'s sizes and repeats is its ceiling
        "only": {"best": True},
        "values": {"tflops": "TFLOP/s", "gbps": "GB/s"},
        "headlines": [
            {
                "label": "fp32 matmul TFLOP/s",
                "column": "tflops",
                "agg": "max",
                "where": {"kind": "matmul", "dtype": "fp32"},
            },
            {  # one path a row: a machine's best path may not be another's
                "label": "bf16 matmul TFLOP/s",
                "column": "tflops",
                "agg": "max",
                "where": {"kind": "matmul", "dtype": "bf16", "path": "matmul"},
            },
            {
                "label": "bf16 autocast F.linear TFLOP/s",
                "column": "tflops",
                "agg": "max",
                "where": {"kind": "matmul", "dtype": "bf16", "path": "autocast_linear"},
            },
            {"label": "copy GB/s", "column": "gbps", "agg": "max", "where": {"kind": "copy"}},
        ],
    },
}
