"""Stage `leaderboard`: the 2026 full-step leaderboard (one training step of the 8B model,
context 32,768, vocab 151,936, batch 2, bf16) through the engine and the plain model: step time,
tokens/s, TFLOP/s, MFU, peak memory per rank, the 10-minute rule and a profiled breakdown.

Keep this file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "The full-step leaderboard (2026)"
# after the communication arithmetic (110): the 2026 handout's section 9 follows its section 8
ORDER = 115

# the parts of docs/questions.md this stage answers and how the report tells (reporting/coverage.py)
QUESTIONS = {"leaderboard": {"evidence": ["q37"], "needs": "gpus:2"}}
