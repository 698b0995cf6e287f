"""The model: parameter counts, shapes, and each part against a straightforward reference."""

import math

import pytest
import torch
import torch.nn.functional as F

from cs336_systems.core import costs as flops
from cs336_systems.model import (
    DEFAULT_EDITION,
    EDITIONS,
    EXTRA_SIZES,
    MODEL_SIZES,
    SIZE_TABLES,
    RMSNorm,
    RotaryEmbedding,
    SwiGLU,
    TransformerLM,
    build_model,
    naive_attention,
    sdpa_attention,
    size_names,
    size_spec,
)

# hand-computed (untied embedding and LM head, SwiGLU, no biases, vocab 10000): V d + L (4 d^2
# + 3 d f + 2 d) + d + d V; 10B: 46,080,000 + 50 * 254,813,184 + 4,608 + 46,080,000
EXPECTED_PARAMS = {
    2026: {
        "small": 128_625_408,
        "medium": 423_183_360,
        "large": 969_411_840,
        "xl": 3_406_809_600,
        "10B": 12_832_823_808,
    },
    2025: {
        "small": 128_625_408,
        "medium": 423_183_360,
        "large": 969_411_840,
        "xl": 1_998_235_200,
        "2.7B": 3_406_809_600,
    },
}
POINTS = [(e, s) for e, table in EXPECTED_PARAMS.items() for s in table]


@pytest.mark.parametrize(("edition", "size"), POINTS)
def test_parameter_count_formula(edition, size):
    spec = size_spec(size, edition)
    assert (
        flops.param_count(10_000, spec["d_model"], spec["num_layers"], spec["d_ff"])
        == EXPECTED_PARAMS[edition][size]
    )


def test_editions_resolve_xl_differently():
    assert DEFAULT_EDITION == 2026 and set(EDITIONS) == {2025, 2026}
    assert size_spec("xl") == size_spec("xl", 2026) == size_spec("xl", "2026")
    assert size_spec("xl", 2026) == {
        "d_model": 2560,
        "d_ff": 10240,
        "num_layers": 32,
        "num_heads": 32,
    }
    assert size_spec("xl", 2025) == {
        "d_model": 1600,
        "d_ff": 6400,
        "num_layers": 48,
        "num_heads": 25,
    }
    assert size_spec("10B", 2026) == {
        "d_model": 4608,
        "d_ff": 12288,
        "num_layers": 50,
        "num_heads": 36,
    }
    assert size_spec("2.7B", 2025) == size_spec("xl", 2026)
    assert size_spec("tiny", 2025) == size_spec("tiny", 2026) == EXTRA_SIZES["tiny"]
    assert MODEL_SIZES == SIZE_TABLES[2026]
    assert size_names(2026) == ["small", "medium", "large", "xl", "10B", "tiny"]
    with pytest.raises(ValueError, match="'2.7B' in the 2026 edition"):
        size_spec("2.7B", 2026)
    with pytest.raises(ValueError, match="'10B' in the 2025 edition"):
        size_spec("10B", 2025)
    with pytest.raises(ValueError, match="unknown edition 2024"):
        size_spec("small", 2024)


@pytest.mark.parametrize("size", ["small", "medium"])
def test_parameter_count_of_built_model(size):
    # built on the meta device: counts without allocating gigabytes
    with torch.device("meta"):
        model = build_model(size, context_length=128)
    assert sum(p.numel() for p in model.parameters()) == EXPECTED_PARAMS[2026][size]


def test_all_sizes_count_on_meta_device():
    for edition, size in POINTS:
        with torch.device("meta"):
            model = build_model(size, context_length=16, edition=edition)
        assert sum(p.numel() for p in model.parameters()) == EXPECTED_PARAMS[edition][size], size


def test_staff_keyword_interface_and_shapes():
    model = TransformerLM(
        vocab_size=100,
        context_length=16,
        d_model=32,
        num_layers=2,
        num_heads=4,
        d_ff=64,
        rope_theta=10000.0,
    )
    x = torch.randint(0, 100, (3, 11))
    assert model(x).shape == (3, 11, 100)
    with pytest.raises(ValueError, match="exceeds context_length"):
        model(torch.randint(0, 100, (1, 17)))
    # no biases anywhere, untied head
    assert not any(name.endswith("bias") for name, _ in model.named_parameters())
    assert model.lm_head.weight.data_ptr() != model.token_embeddings.weight.data_ptr()


def test_rmsnorm_matches_reference_and_keeps_dtype():
    torch.manual_seed(0)
    norm = RMSNorm(16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16))
    x = torch.randn(4, 5, 16)
    ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(norm(x), ref)
    xb = x.to(torch.bfloat16)
    out = norm(xb)
    assert out.dtype == torch.bfloat16
    # computed in fp32: equals the fp32 computation on the upcast input, rounded once
    ref_b = (
        xb.float() / torch.sqrt(xb.float().pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    ).to(torch.bfloat16)
    torch.testing.assert_close(out, ref_b, rtol=0, atol=0)


def test_rope_rotates_pairs_by_position():
    d, n, theta = 8, 6, 10000.0
    rope = RotaryEmbedding(d, context_length=n, theta=theta)
    x = torch.randn(2, n, d)
    out = rope(x)
    ref = torch.empty_like(x)
    for pos in range(n):
        for i in range(d // 2):
            angle = pos * theta ** (-2 * i / d)
            c, s = math.cos(angle), math.sin(angle)
            a, b = x[:, pos, 2 * i], x[:, pos, 2 * i + 1]
            ref[:, pos, 2 * i] = a * c - b * s
            ref[:, pos, 2 * i + 1] = a * s + b * c
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # rotation preserves norms, and position 0 is the identity
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[:, 0], x[:, 0])


def test_swiglu_matches_formula():
    torch.manual_seed(0)
    ffn = SwiGLU(8, 24)
    x = torch.randn(3, 8)
    ref = (F.silu(x @ ffn.w1.weight.T) * (x @ ffn.w3.weight.T)) @ ffn.w2.weight.T
    torch.testing.assert_close(ffn(x), ref)


@pytest.mark.parametrize("n_q,n_k", [(7, 7), (5, 9)])
def test_naive_attention_matches_loop_reference(n_q, n_k):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, n_q, 4), torch.randn(2, 3, n_k, 4), torch.randn(2, 3, n_k, 4)
    out = naive_attention(q, k, v, is_causal=True)
    ref = torch.empty_like(out)
    offset = n_k - n_q  # bottom-right aligned, as SDPA's is_causal for a square matrix
    for i in range(n_q):
        s = q[..., i : i + 1, :] @ k[..., : i + offset + 1, :].transpose(-2, -1) / 2.0
        ref[..., i, :] = (s.softmax(-1) @ v[..., : i + offset + 1, :]).squeeze(-2)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    if n_q == n_k:
        torch.testing.assert_close(sdpa_attention(q, k, v), out, rtol=1e-5, atol=1e-5)


def test_attention_is_replaceable():
    model = TransformerLM(50, 8, 16, 2, 2, 32)
    calls = []

    def spy(q, k, v, is_causal=True):
        calls.append(q.shape)
        return naive_attention(q, k, v, is_causal)

    x = torch.randint(0, 50, (1, 8))
    before = model(x)
    model.set_attention(spy)
    torch.testing.assert_close(model(x), before)
    assert calls == [(1, 2, 8, 8)] * 2
    model.set_attention("sdpa")
    torch.testing.assert_close(model(x), before, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="unknown attention"):
        model.set_attention("nope")


def test_model_flops_formula_by_hand():
    # one layer, d=2, d_ff=4, vocab 3: matmul params 4*4 + 3*2*4 + 2*3 = 46
    assert flops.matmul_param_count(3, 2, 1, 4) == 46
    f = flops.model_flops(3, 2, 1, 4, batch=1, seq=5, mode="forward")
    assert f == 2 * 46 * 5 + 4 * 1 * 1 * 25 * 2
    assert flops.model_flops(3, 2, 1, 4, 1, 5, "train_step") == 3 * f
    assert flops.attention_flops(1, 1, 4, 4, 2, causal=True, pass_="forward") == 4 * 16 * 2 / 2
    assert flops.attention_flops(1, 1, 4, 4, 2, causal=False, pass_="forward_backward") == 3.5 * 128
