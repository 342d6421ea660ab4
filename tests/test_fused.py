import dataclasses

import pytest
import torch

from cgtool.attention import make_backend
from cgtool.model import fused, fused_launch
from cgtool.model.layers import RotaryEmbedding
from cgtool.model.loader import build_model
from cgtool.runtime.engine import ModelRunner, extend_batch
from cgtool.runtime.kv import KVPool
from cgtool.specs.config import load_model_config

# Without a GPU the kernels run in Triton's interpreter (tests/conftest.py): small shapes.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16]
GPU_NUM_TOKENS = [1, 7, 256, 2048]


def _assert_close(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if expected.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    else:
        # A few bf16 ulps: the kernels round where the reference rounds, but the interpreter
        # truncates to bf16 and fp32 sums run in another order.
        torch.testing.assert_close(actual.float(), expected.float(), rtol=2**-6, atol=2**-6)


def _randn(*shape, dtype, device=DEVICE):
    return torch.randn(*shape, device=device).to(dtype)


def _qkv_views(n, heads, kv_heads, head_dim, dtype, device=DEVICE):
    """q and k as the model hands them over: strided [n, heads, head_dim] views of a qkv output."""
    qkv = _randn(n, (heads + 2 * kv_heads) * head_dim, dtype=dtype, device=device)
    q, k, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    return q.view(n, heads, head_dim), k.view(n, kv_heads, head_dim)


def _cos_sin(head_dim, max_positions, device=DEVICE):
    cfg = dataclasses.replace(load_model_config("llama-3.1-8b"), head_dim=head_dim)
    return RotaryEmbedding(cfg, max_positions).cos_sin.to(device)


# ---------------------------------------------------------------- kernels vs references


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_kernel_matches_reference_on_strided_rows(dtype):
    x = _randn(5, 80, dtype=dtype)[:, 8:56]  # rows of 48 with a row stride of 80
    weight = _randn(48, dtype=dtype)
    _assert_close(torch.ops.cgtool.rms_norm(x, weight, 1e-6), fused.rms_norm_ref(x, weight, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_kernel_normalises_each_head_of_a_strided_view(dtype):
    q, k = _qkv_views(3, 4, 2, 24, dtype)
    weight = _randn(24, dtype=dtype)
    for x in (q, k):
        out = torch.ops.cgtool.rms_norm(x, weight, 1e-6)
        assert out.is_contiguous()
        _assert_close(out, fused.rms_norm_ref(x, weight, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_returns_the_norm_and_the_new_residual(dtype):
    x, residual = _randn(6, 48, dtype=dtype), _randn(6, 48, dtype=dtype)
    weight = _randn(48, dtype=dtype)
    normed, new_residual = torch.ops.cgtool.fused_add_rms_norm(x, residual, weight, 1e-5)
    expected_normed, expected_residual = fused.fused_add_rms_norm_ref(x, residual, weight, 1e-5)
    _assert_close(new_residual, expected_residual)
    _assert_close(normed, expected_normed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place_fused_add_rms_norm_writes_over_its_inputs_with_the_same_values(dtype):
    x, residual = _randn(6, 48, dtype=dtype), _randn(6, 48, dtype=dtype)
    weight = _randn(48, dtype=dtype)
    expected_normed, expected_residual = fused.fused_add_rms_norm_ref(x, residual, weight, 1e-5)
    x_ptr, residual_ptr = x.data_ptr(), residual.data_ptr()
    normed, new_residual = fused_launch.launch_rms_norm(x, residual, weight, 1e-5, in_place=True)
    assert (normed.data_ptr(), new_residual.data_ptr()) == (x_ptr, residual_ptr)
    _assert_close(new_residual, expected_residual)
    _assert_close(normed, expected_normed)


def test_in_place_fused_add_rms_norm_allocates_where_the_output_dtype_differs():
    """A wider weight promotes the norm's output: it cannot be written over a bf16 x, and
    then neither input is written over."""
    x, residual = _randn(4, 32, dtype=torch.bfloat16), _randn(4, 32, dtype=torch.bfloat16)
    weight = _randn(32, dtype=torch.float32)
    x_before, residual_before = x.clone(), residual.clone()
    normed, new_residual = fused_launch.launch_rms_norm(x, residual, weight, 1e-5, in_place=True)
    assert normed.dtype == torch.float32
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)
    expected_normed, expected_residual = fused_launch.launch_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(normed, expected_normed) and torch.equal(new_residual, expected_residual)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_rotates_q_and_k_from_strided_views_into_contiguous_tensors(dtype):
    q, k = _qkv_views(5, 6, 2, 24, dtype)  # 6 heads and a half of 12: both padded in the kernel
    cos_sin = _cos_sin(24, 64)
    positions = torch.tensor([0, 63, 7, 7, 31], device=DEVICE)
    q_out, k_out = torch.ops.cgtool.apply_rope(q, k, positions, cos_sin)
    q_ref, k_ref = fused.apply_rope_ref(q, k, positions, cos_sin)
    assert q_out.is_contiguous() and k_out.is_contiguous()
    _assert_close(q_out, q_ref)
    _assert_close(k_out, k_ref)


def test_rope_at_position_zero_is_the_identity():
    q, k = _qkv_views(2, 4, 2, 16, torch.float32)
    positions = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    q_out, k_out = torch.ops.cgtool.apply_rope(q, k, positions, _cos_sin(16, 8))
    torch.testing.assert_close(q_out, q.contiguous())
    torch.testing.assert_close(k_out, k.contiguous())


def _rope_store_case(n, heads, kv_heads, head_dim, dtype, device=DEVICE):
    """q, k, v as strided views of one qkv output; scattered slots; caches of NaN."""
    slots = 2 * n + 8  # room for a slot per token and some never written
    qkv = _randn(n, (heads + 2 * kv_heads) * head_dim, dtype=dtype, device=device)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    loc = torch.randperm(slots)[:n].to(device)
    caches = [torch.full((slots, kv_heads, head_dim), float("nan"), dtype=dtype, device=device) for _ in range(2)]
    return q.view(n, heads, head_dim), k.view(n, kv_heads, head_dim), v, loc, caches


def _check_rope_store(n, heads, kv_heads, head_dim, dtype, max_positions, device=DEVICE):
    q, k, v, loc, (k_cache, v_cache) = _rope_store_case(n, heads, kv_heads, head_dim, dtype, device=device)
    cos_sin = _cos_sin(head_dim, max_positions, device=device)
    positions = torch.randint(0, max_positions, (n,), device=device)
    q_out = fused_launch.launch_rope_and_store(q, k, v, positions, cos_sin, k_cache, v_cache, loc)
    # Exactly what the separate rope kernel and store write: the same arithmetic, one launch.
    q_rope, k_rope = torch.ops.cgtool.apply_rope(q, k, positions, cos_sin)
    exact = {"rtol": 0, "atol": 0}
    torch.testing.assert_close(q_out, q_rope, **exact)
    torch.testing.assert_close(k_cache[loc], k_rope, **exact)
    torch.testing.assert_close(v_cache[loc], v.reshape(n, kv_heads, head_dim), **exact)
    others = torch.ones(k_cache.shape[0], dtype=torch.bool, device=device)
    others[loc] = False
    assert k_cache[others].isnan().all() and v_cache[others].isnan().all()
    q_ref = fused.apply_rope_and_store_ref(q, k, v, positions, cos_sin, *[c.clone() for c in (k_cache, v_cache)], loc)
    _assert_close(q_out, q_ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_and_store_writes_the_rope_kernels_k_and_v_to_their_slots(dtype):
    _check_rope_store(5, 6, 2, 24, dtype, max_positions=64)  # padded heads and half in the kernel


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_and_store_from_the_unsplit_qkv_writes_what_it_writes_from_the_views(dtype):
    n, heads, kv_heads, head_dim = 5, 6, 2, 24
    q, k, v, loc, (k_cache, v_cache) = _rope_store_case(n, heads, kv_heads, head_dim, dtype)
    qkv = q.reshape(n, -1)._base  # the one qkv output the three views share
    cos_sin, positions = _cos_sin(head_dim, 64), torch.randint(0, 64, (n,), device=DEVICE)
    q_views = fused_launch.launch_rope_and_store(q, k, v, positions, cos_sin, k_cache, v_cache, loc).clone()
    caches = [c.clone() for c in (k_cache, v_cache)]
    for c in (k_cache, v_cache):
        c.fill_(float("nan"))
    q_qkv = fused_launch.launch_rope_and_store_qkv(qkv, heads, kv_heads, head_dim, positions, cos_sin, k_cache, v_cache, loc)
    exact = {"rtol": 0, "atol": 0, "equal_nan": True}
    torch.testing.assert_close(q_qkv, q_views.view(n, heads * head_dim), **exact)
    torch.testing.assert_close(k_cache, caches[0], **exact)
    torch.testing.assert_close(v_cache, caches[1], **exact)
    ref_caches = [torch.full_like(c, float("nan")) for c in caches]
    q_ref = fused.apply_rope_and_store_qkv(qkv.cpu(), heads, kv_heads, head_dim, positions.cpu(), cos_sin.cpu(),
                                           *[c.cpu() for c in ref_caches], loc.cpu())
    _assert_close(q_ref.to(DEVICE), q_qkv)


def test_rope_and_store_refuses_fewer_slots_than_tokens():
    q, k, v, loc, (k_cache, v_cache) = _rope_store_case(4, 2, 1, 8, torch.float32)
    with pytest.raises(ValueError, match="3 KV slots for 4 tokens"):
        fused_launch.launch_rope_and_store(q, k, v, torch.arange(4, device=DEVICE), _cos_sin(8, 8), k_cache, v_cache, loc[:3])


def test_rope_and_store_reference_rotates_q_and_stores_k_and_v_by_hand():
    # Rotate-half RoPE (Llama's, as SGLang's is_neox_style) with angles whose cos and sin are
    # exact: position 0 turns nothing; position 1 turns the first pair (dims 0 and 2) by 90
    # degrees; position 2 turns it by 180. Rows are [cos of each pair | sin of each pair].
    cos_sin = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0], [-1.0, 1.0, 0.0, 0.0]])
    q = torch.tensor([[1.0, 2.0, 3.0, 4.0]] * 3).view(3, 1, 4)
    k = torch.tensor([[5.0, 6.0, 7.0, 8.0]] * 3).view(3, 1, 4)
    v = torch.tensor([[9.0, 10.0, 11.0, 12.0], [13.0, 14.0, 15.0, 16.0], [17.0, 18.0, 19.0, 20.0]])
    k_cache, v_cache = (torch.full((6, 1, 4), float("nan")) for _ in range(2))
    loc = torch.tensor([4, 0, 2])
    q_out = fused.apply_rope_and_store_ref(q, k, v, torch.tensor([0, 1, 2]), cos_sin, k_cache, v_cache, loc)
    # (x0, x2) -> (x0 cos - x2 sin, x2 cos + x0 sin): 90 degrees takes (1, 3) to (-3, 1).
    assert q_out.view(3, 4).tolist() == [[1, 2, 3, 4], [-3, 2, 1, 4], [-1, 2, -3, 4]]
    assert k_cache[loc].view(3, 4).tolist() == [[5, 6, 7, 8], [-7, 6, 5, 8], [-5, 6, -7, 8]]
    assert v_cache[loc].view(3, 4).tolist() == v.tolist()
    assert torch.isnan(k_cache[[1, 3, 5]]).all()  # no other slot is written


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_reference_across_blocks(dtype):
    gate_up = _randn(3, 2 * (fused_launch.SILU_BLOCK + 76), dtype=dtype) * 4  # a full block and a tail
    _assert_close(torch.ops.cgtool.silu_and_mul(gate_up), fused.silu_and_mul_ref(gate_up))


def test_fused_ops_trace_as_opaque_nodes_with_a_dynamic_token_dim():
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm

    def block(x, residual, weight, q, k, positions, cos_sin, gate_up):
        normed, residual = torch.ops.cgtool.fused_add_rms_norm(x, residual, weight, 1e-6)
        q, k = torch.ops.cgtool.apply_rope(q, k, positions, cos_sin)
        act = torch.ops.cgtool.silu_and_mul(gate_up)
        return torch.ops.cgtool.rms_norm(normed, weight, 1e-6), residual, q, k, act

    compiled = torch.compile(block, backend=record, fullgraph=True, dynamic=True)
    f32, weight, cos_sin = torch.float32, _randn(32, dtype=torch.float32), _cos_sin(16, 32)
    for n in (3, 5):
        x, residual = _randn(n, 32, dtype=f32), _randn(n, 32, dtype=f32)
        gate_up = _randn(n, 64, dtype=f32)
        q, k = _qkv_views(n, 4, 2, 16, f32)
        args = (x, residual, weight, q, k, torch.arange(n, device=DEVICE), cos_sin, gate_up)
        for got, expected in zip(compiled(*args), block(*args)):
            torch.testing.assert_close(got, expected)
    assert len(graphs) == 1  # one trace serves both token counts
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    fused_ops = sorted(t.split(".")[1] for t in targets if t.startswith("cgtool."))
    assert fused_ops == ["apply_rope", "fused_add_rms_norm", "rms_norm", "silu_and_mul"]

# ---------------------------------------------------------------- GPU: real shapes


@pytest.mark.gpu
@pytest.mark.parametrize("n", GPU_NUM_TOKENS)
def test_norms_at_llama_8b_shapes(n):
    x, residual = _randn(n, 4096, dtype=torch.bfloat16), _randn(n, 4096, dtype=torch.bfloat16)
    weight = _randn(4096, dtype=torch.bfloat16)
    _assert_close(torch.ops.cgtool.rms_norm(x, weight, 1e-5), fused.rms_norm_ref(x, weight, 1e-5))
    got = torch.ops.cgtool.fused_add_rms_norm(x, residual, weight, 1e-5)
    for actual, expected in zip(got, fused.fused_add_rms_norm_ref(x, residual, weight, 1e-5)):
        _assert_close(actual, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("n", GPU_NUM_TOKENS)
@pytest.mark.parametrize("head_dim", [128, 64])
def test_rope_and_qk_norm_at_real_shapes(n, head_dim):
    q, k = _qkv_views(n, 32, 8, head_dim, torch.bfloat16)
    cos_sin = _cos_sin(head_dim, 131072)
    positions = torch.randint(0, 131072, (n,), device="cuda")
    got = torch.ops.cgtool.apply_rope(q, k, positions, cos_sin)
    for actual, expected in zip(got, fused.apply_rope_ref(q, k, positions, cos_sin)):
        _assert_close(actual, expected)
    weight = _randn(head_dim, dtype=torch.bfloat16)
    _assert_close(torch.ops.cgtool.rms_norm(q, weight, 1e-6), fused.rms_norm_ref(q, weight, 1e-6))


@pytest.mark.gpu
@pytest.mark.parametrize("n", GPU_NUM_TOKENS)
@pytest.mark.parametrize("head_dim", [128, 64])
def test_rope_and_store_at_real_shapes(n, head_dim):
    _check_rope_store(n, 32, 8, head_dim, torch.bfloat16, max_positions=131072)


@pytest.mark.gpu
def test_a_forward_storing_kv_from_rope_matches_one_storing_from_the_attention_op(monkeypatch):
    from cgtool.model import llama

    cfg = dataclasses.replace(load_model_config("llama-3.1-8b"), num_layers=2, vocab_size=1000)
    model = build_model(cfg, device="cuda", dtype=torch.bfloat16, max_positions=256)

    def run():
        pool = KVPool(cfg, 1024, max_reqs=4, max_context_len=256, dtype=torch.bfloat16, device="cuda")
        runner = ModelRunner(model, pool, make_backend("triton", cfg.num_heads, cfg.head_dim))
        row = pool.alloc_request(40)[0]
        hidden = runner.forward_eager(extend_batch(pool, [row], [0], [list(range(3, 40))]))
        return hidden, pool.k_buffers + pool.v_buffers

    fused_hidden, fused_cache = run()
    monkeypatch.setattr(llama, "stores_with_rope", lambda q: False)
    split_hidden, split_cache = run()
    torch.testing.assert_close(fused_hidden, split_hidden, rtol=0, atol=0)
    for got, expected in zip(fused_cache, split_cache):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("n", GPU_NUM_TOKENS)
def test_silu_and_mul_at_llama_8b_shapes(n):
    gate_up = _randn(n, 2 * 14336, dtype=torch.bfloat16) * 4
    _assert_close(torch.ops.cgtool.silu_and_mul(gate_up), fused.silu_and_mul_ref(gate_up))


@pytest.mark.gpu
def test_fused_ops_replay_in_a_cuda_graph_with_new_inputs():
    n = 8
    x, residual = _randn(n, 4096, dtype=torch.bfloat16), _randn(n, 4096, dtype=torch.bfloat16)
    weight, gate_up = _randn(4096, dtype=torch.bfloat16), _randn(n, 2 * 14336, dtype=torch.bfloat16)
    q, k = _qkv_views(n, 32, 8, 128, torch.bfloat16)
    positions, cos_sin = torch.arange(n, device="cuda"), _cos_sin(128, 4096)

    def step():
        return (
            *fused.fused_add_rms_norm(x, residual, weight, 1e-5),
            *fused.apply_rope(q, k, positions, cos_sin),
            fused.silu_and_mul(gate_up),
        )

    step()  # compile the kernels outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    for t in (x, residual, q, k, gate_up):
        t.copy_(torch.randn_like(t, dtype=torch.float32))
    positions.copy_(torch.randint(0, 4096, (n,), device="cuda"))
    graph.replay()
    expected = (
        *fused.fused_add_rms_norm_ref(x, residual, weight, 1e-5),
        *fused.apply_rope_ref(q, k, positions, cos_sin),
        fused.silu_and_mul_ref(gate_up),
    )
    for actual, ref in zip(outputs, expected):
        _assert_close(actual, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["tiny", "qwen3-8b"])
def test_model_on_the_gpu_matches_its_torch_reference_path(monkeypatch, preset):
    cfg = load_model_config(preset)
    if preset != "tiny":  # qk-norm and a 128 head_dim, two layers
        cfg = dataclasses.replace(cfg, num_layers=2, vocab_size=1000)
    model = build_model(cfg, device="cuda", dtype=torch.bfloat16, max_positions=256)
    pool = KVPool(cfg, 1024, max_reqs=4, max_context_len=256, dtype=torch.bfloat16, device="cuda")
    runner = ModelRunner(model, pool, make_backend("torch", cfg.num_heads, cfg.head_dim))
    row = pool.alloc_request(40)[0]
    batch = extend_batch(pool, [row], [0], [list(range(3, 40))])
    got = runner.forward_eager(batch)
    monkeypatch.setattr(fused, "_use_triton", lambda x: False)
    expected = runner.forward_eager(batch)
    torch.testing.assert_close(got.float(), expected.float(), atol=3e-2, rtol=3e-2)
