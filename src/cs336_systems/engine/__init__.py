"""The training-step engine: a fused LM-head cross-entropy, a Triton AdamW on fp32 master
weights, the memory model and the step builder. On the measuring floor above `parallel/`
(whose FSDP and DDP it uses) and `profiling/`, below the stages."""
