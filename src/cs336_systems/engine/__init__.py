"""The training-step engine: a fused LM-head cross-entropy and the step builder (rank 3, beside
parallel/ and profiling/)."""
