"""Time the Triton decode and extend kernels on the GPU against their physical limits.

Decode is timed eagerly and as a replayed CUDA graph (what serving runs); its bound is
the K/V bytes read over the device-to-device copy bandwidth measured here. Extend is
compared with PyTorch's flash SDPA on the same causal shape.

    python3 benchmarks/bench_attention.py [--sweep]
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from cgtool.attention import triton_decode, triton_extend
from cgtool.attention.torch_ref import TorchAttentionBackend
from cgtool.attention.triton_backend import TritonAttentionBackend
from cgtool.runtime.batch import ForwardBatch
from cgtool.runtime.engine import decode_batch, extend_batch
from cgtool.runtime.kv import KVPool
from cgtool.specs.config import ModelConfig

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # llama-3.1-8b
DTYPE = torch.bfloat16


def time_us(fn: Callable[[], object], iters: int = 200) -> float:
    for _ in range(10):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def as_graph(fn: Callable[[], object]) -> Callable[[], object]:
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def copy_bandwidth_gbs() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / time_us(lambda: dst.copy_(src), iters=20) / 1e3


def make_pool(lens: list[int]) -> tuple[KVPool, list[int]]:
    cfg = ModelConfig(
        name="bench", architecture="LlamaForCausalLM", vocab_size=16, hidden_size=HEADS * HEAD_DIM,
        intermediate_size=16, num_layers=1, num_heads=HEADS, num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM, max_context_len=max(lens),
    )
    pool = KVPool(cfg, sum(lens) + 1, len(lens) + 1, max(lens), DTYPE, "cuda")
    pool.k_buffers[0].normal_()
    pool.v_buffers[0].normal_()
    rows = [pool.alloc_request(n)[0] for n in lens]
    return pool, rows


def decode_case(bs: int, seq_len: int) -> tuple[KVPool, ForwardBatch, torch.Tensor, torch.Tensor]:
    """Pool, batch, q and the reference output of one decode step."""
    pool, rows = make_pool([seq_len] * bs)
    batch = decode_batch(pool, rows, [seq_len - 1] * bs, [0] * bs)
    q = torch.randn(bs, HEADS * HEAD_DIM, dtype=DTYPE, device="cuda")
    ref = torch.empty_like(q)
    TorchAttentionBackend(HEADS, HEAD_DIM).forward(q, ref, 0, batch, pool)
    return pool, batch, q, ref


def bench_decode(case: tuple, num_kv_splits: int | None, copy_gbs: float) -> str:
    pool, batch, q, ref = case
    bs, seq_len = q.shape[0], batch.seq_lens_cpu[0]
    out = torch.empty_like(q)
    backend = TritonAttentionBackend(HEADS, HEAD_DIM, num_kv_splits)
    step = lambda: backend.forward(q, out, 0, batch, pool)
    eager_us, replay_us = time_us(step), time_us(as_graph(step))
    err = (out.float() - ref.float()).abs().max().item()
    kv_bytes = 2 * bs * seq_len * KV_HEADS * HEAD_DIM * DTYPE.itemsize
    bound_us = kv_bytes / copy_gbs / 1e3
    return (
        f"decode bs={bs:<3} seq={seq_len:<6} eager {eager_us:7.1f} us  graph {replay_us:7.1f} us  "
        f"K/V {kv_bytes / 2**20:7.1f} MiB  bound {bound_us:6.1f} us ({100 * bound_us / replay_us:4.0f}%)"
        f"  max err {err:.3f}"
    )


def bench_extend(num_tokens: int) -> str:
    pool, rows = make_pool([num_tokens])
    batch = extend_batch(pool, rows, [0], [[0] * num_tokens])
    q = torch.randn(num_tokens, HEADS * HEAD_DIM, dtype=DTYPE, device="cuda")
    out, ref = torch.empty_like(q), torch.empty_like(q)
    TorchAttentionBackend(HEADS, HEAD_DIM).forward(q, ref, 0, batch, pool)
    backend = TritonAttentionBackend(HEADS, HEAD_DIM)
    triton_us = time_us(lambda: backend.forward(q, out, 0, batch, pool), iters=50)
    err = (out.float() - ref.float()).abs().max().item()
    qh = q.view(1, num_tokens, HEADS, HEAD_DIM).transpose(1, 2)
    kh = pool.k_buffers[0][1 : num_tokens + 1].unsqueeze(0).transpose(1, 2)
    vh = pool.v_buffers[0][1 : num_tokens + 1].unsqueeze(0).transpose(1, 2)
    sdpa_us = time_us(
        lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True), iters=50
    )
    tflops = 4 * HEADS * HEAD_DIM * num_tokens * num_tokens / 2 / triton_us / 1e6
    return (
        f"extend tokens={num_tokens:<5} triton {triton_us:7.1f} us ({tflops:5.0f} TFLOP/s)  "
        f"torch SDPA {sdpa_us:7.1f} us  max err {err:.3f}"
    )


def sweep(copy_gbs: float) -> None:
    """Launch configurations side by side, to choose the defaults in the kernel modules."""
    cases = [decode_case(bs, n) for bs, n in [(1, 1024), (1, 32768), (8, 4096), (64, 1024)]]
    for block_n, num_stages in [(32, 2), (64, 2), (32, 3), (64, 3)]:
        triton_decode.launch_config = lambda b=block_n, s=num_stages: (b, 4, s)
        for splits in (16, 32, 64):
            print(f"-- decode BLOCK_N {block_n} stages {num_stages} splits {splits}")
            for case in cases:
                print(bench_decode(case, splits, copy_gbs))
    default_decode = triton_decode.launch_config
    for config in [(128, 64, 8, 2), (128, 64, 4, 2), (64, 64, 4, 2), (128, 128, 8, 2), (128, 64, 8, 3)]:
        triton_extend.launch_config = lambda head_dim, c=config: c
        print(f"-- extend BLOCK_M, BLOCK_N, warps, stages {config}")
        for num_tokens in [512, 2048, 8192]:
            print(bench_extend(num_tokens))
    triton_decode.launch_config = default_decode


def main() -> None:
    copy_gbs = copy_bandwidth_gbs()
    print(f"{torch.cuda.get_device_name()}  copy bandwidth {copy_gbs:.0f} GB/s  "
          f"heads {HEADS}/{KV_HEADS} head_dim {HEAD_DIM} {DTYPE}")
    for bs, seq_len in [(1, 1024), (1, 32768), (64, 1024), (256, 1024)]:
        print(bench_decode(decode_case(bs, seq_len), None, copy_gbs))
    for num_tokens in [512, 2048, 8192]:
        print(bench_extend(num_tokens))
    if "--sweep" in sys.argv:
        sweep(copy_gbs)


if __name__ == "__main__":
    main()
