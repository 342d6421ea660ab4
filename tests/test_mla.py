import torch

from cgtool.model.fused import apply_rope_ref
from cgtool.model.mla import pairs_to_halves


def _interleaved_rope(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    # DeepSeek's rotation: pairs (x0, x1), (x2, x3)... as complex numbers times e^{i·angle}
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def test_halves_layout_keeps_every_rotated_query_key_product():
    gen = torch.Generator().manual_seed(0)
    n, heads, dim, max_pos = 5, 3, 8, 32
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    q, k = torch.randn(n, heads, dim, generator=gen), torch.randn(n, 1, dim, generator=gen)
    positions = torch.tensor([0, 3, 7, 11, 30])
    angles = freqs[positions].unsqueeze(1)
    want = torch.einsum("nhd,mkd->nhm", _interleaved_rope(q, angles), _interleaved_rope(k, angles))
    q_h, k_h = apply_rope_ref(pairs_to_halves(q), pairs_to_halves(k), positions, cos_sin)
    torch.testing.assert_close(torch.einsum("nhd,mkd->nhm", q_h, k_h), want)


def test_value_projection_writes_token_major_rows_eagerly_and_compiled():
    # Eagerly the product writes o_proj's layout itself; under torch.compile (where Dynamo
    # refuses that `out=`) the product and its transpose's copy give the same values.
    from cgtool.model.mla import value_projection

    gen = torch.Generator().manual_seed(1)
    heads, n, rank, v = 4, 3, 8, 5
    o_latent = torch.randn(n, heads, rank, generator=gen).transpose(0, 1)
    w_uv = torch.randn(heads, v, rank, generator=gen).transpose(1, 2)
    want = torch.einsum("hnr,hrv->nhv", o_latent, w_uv).reshape(n, heads * v)
    got = value_projection(o_latent, w_uv)
    assert got.shape == (n, heads * v) and got.is_contiguous()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.compile(value_projection, fullgraph=True)(o_latent, w_uv), want)
