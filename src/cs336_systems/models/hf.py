"""HuggingFace causal LMs built from their config, for the config's `own_model` key
(docs/own-model.md): no weights are downloaded, the model starts from its random init.

    own_model: {name: hf-gpt2-small, factory: "cs336_systems.models.hf:gpt2_small"}

Each factory takes the study's vocabulary and context length (core/own_model.py passes the
keywords a factory accepts); its model returns HuggingFace's output, whose `.logits` the
study reads. Needs `transformers` (the `hf` dependency group, installed by `uv sync`).
"""

from __future__ import annotations

# GPT-2 without dropout (as the course's model): the study times the same step every time
NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}


def causal_lm(config):
    """`AutoModelForCausalLM.from_config(config)`: the architecture, random weights."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(config)


def gpt2(vocab_size: int, context_length: int, d_model: int, layers: int, heads: int):
    """A GPT-2 of the given width and depth (its MLP 4 d_model wide)."""
    from transformers import GPT2Config

    cfg = GPT2Config(
        vocab_size=vocab_size,
        n_positions=context_length,
        n_embd=d_model,
        n_layer=layers,
        n_head=heads,
        # GPT-2's own end-of-text id (50256) lies outside the study's vocabulary
        bos_token_id=vocab_size - 1,
        eos_token_id=vocab_size - 1,
        **NO_DROPOUT,
    )
    return causal_lm(cfg)


def gpt2_small(vocab_size: int, context_length: int):
    """GPT-2 small's shape (768 wide, 12 layers, 12 heads): the course's `small` in GPT-2's
    architecture (learned positions, GELU MLP, LayerNorm, tied embeddings)."""
    return gpt2(vocab_size, context_length, 768, 12, 12)


def gpt2_tiny(vocab_size: int, context_length: int):
    """A GPT-2 of the course's `tiny` width and depth (128 wide, 2 layers, 4 heads): a CPU run."""
    return gpt2(vocab_size, context_length, 128, 2, 4)


def llama_small(vocab_size: int, context_length: int):
    """A Llama (RoPE, SwiGLU, RMSNorm, untied head) of the course's `small` shape: 768 wide,
    12 layers, 12 heads, a 2048-wide SwiGLU (about the parameters of a 3072-wide GELU MLP)."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        max_position_embeddings=context_length,
        tie_word_embeddings=False,
    )
    return causal_lm(cfg)
