"""Stage `flash`: Our FlashAttention-2 (PyTorch, Triton) against naive attention and PyTorch SDPA backends.

`python -m cs336_systems.stages.flash` measures (see measure.py); analysis.py turns the CSVs into
figures and the report's sentences; plan.py (where present) holds what the workflow needs to plan
the stage's jobs. Keep this file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "FlashAttention-2"
# where the section sits in the report (ascending)
ORDER = 80

# the parts of docs/questions.md this stage answers and how the report tells (reporting/coverage.py)
QUESTIONS = {
    "flash_benchmarking.a": {"evidence": ["speedups", "tflops"], "needs": "gpu"},
    "flash_leaderboard": {"evidence": ["leaderboard.available"], "needs": "gpu"},
    "ours.flash_leaderboard": {"evidence": ["leaderboard.available"], "needs": "gpu"},
}
# numbers that cannot be right (reporting/sanity.py): a TFLOP/s above this machine's measured
# matmul peak for the dtype (attention is matmuls plus cheaper work: it cannot beat them)
SANITY = {
    "flash": [
        {
            "kind": "rate_above_ceiling",
            "rates": ["fwd_tflops", "bwd_tflops", "fwd_bwd_tflops", "lb_tflops"],
            "dtype": "dtype",
        },
        # attention is matmuls plus softmax and masking: a pass within 10% of the plain GEMM
        # peak (an H100 forward read 720 of 773 TFLOP/s, 27% above cuDNN, in a 20 ms window)
        # is measured again before it is believed
        {
            "kind": "rate_above_ceiling",
            "rates": ["fwd_tflops", "bwd_tflops", "fwd_bwd_tflops"],
            "dtype": "dtype",
            "fraction": 0.9,
            "why": "attention runs softmax and masking beside its matmuls, so a rate this near "
            "the GEMM peak needs measuring again (a longer do_bench window) before it is read",
        },
    ],
}

# the numbers the comparison report puts side by side across machines (reporting/compare.py)
COMPARE = {
    "flash": {
        "keys": ["grid", "impl", "dtype", "d_head", "seq_len"],
        "values": {"fwd_bwd_ms_median": "fwd+bwd ms", "fwd_bwd_tflops": "TFLOP/s"},
        # our Triton kernel on a CPU runs in Triton's interpreter: not the kernel
        "exclude": [{"impl": "flash_triton", "device": "cpu"}],
        "headlines": [
            {
                "label": "best fwd+bwd TFLOP/s, our Triton FA2",
                "column": "fwd_bwd_tflops",
                "agg": "max",
                "where": {"impl": "flash_triton"},
            },
            {
                "label": "best fwd+bwd TFLOP/s, SDPA flash",
                "column": "fwd_bwd_tflops",
                "agg": "max",
                "where": {"impl": "sdpa_flash"},
            },
        ],
    },
}
