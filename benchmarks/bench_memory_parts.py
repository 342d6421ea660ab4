"""Issue 32: the memory terms a --mem-fraction-static must leave free, each measured on the GPU.

Device-wide parts first (CUDA context, cuBLAS workspaces, the sampler's fp32 logits), then per
model (random weights, a small KV pool): the eager activation peak of an extend and of a
decode at two sizes each, allocator fragmentation at those peaks, and graph memory size by size
(the pool and outside torch), captured twice in one process. One JSON file, figures in bytes.

    python3 benchmarks/bench_memory_parts.py --models llama-3.1-8b,qwen3-30b-a3b --out parts.json
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import torch

MIB = 1 << 20


def used_bytes() -> int:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free


def device_parts(rows: list[int], vocabs: list[int]) -> dict:
    """CUDA context, the cuBLAS workspace of a first GEMM on a stream and in a capture, and
    the sampler's peak over fp32 logits [rows, vocab] (temperature, softmax, argmax, sample)."""
    before_init = 0
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    context = used_bytes() - torch.cuda.memory_reserved()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    outside = used_bytes() - torch.cuda.memory_reserved()
    a @ a
    cublas_stream = used_bytes() - torch.cuda.memory_reserved() - outside
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        a @ a
    torch.cuda.synchronize()
    cublas_side = used_bytes() - torch.cuda.memory_reserved() - outside - cublas_stream
    sampler = {}
    for vocab in vocabs:
        for n in rows:
            gc.collect()
            torch.cuda.empty_cache()
            hidden = torch.randn(n, vocab, device="cuda", dtype=torch.bfloat16)  # the lm head's output
            start = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            logits = hidden.float()  # SGLang's next-token logits are fp32
            logits.div_(torch.full((n, 1), 0.7, device="cuda"))
            probs = torch.softmax(logits, dim=-1)
            greedy = torch.argmax(logits, dim=-1)
            sampled = torch.multinomial(probs, 1)
            torch.cuda.synchronize()
            sampler[f"{n}x{vocab}"] = torch.cuda.max_memory_allocated() - start
            del hidden, logits, probs, greedy, sampled
    del a
    return {"cuda_context_bytes": context + before_init, "cublas_workspace_bytes": cublas_stream,
            "cublas_side_stream_bytes": cublas_side, "sampler_peak_bytes": sampler}


def model_parts(name: str, kv_tokens: int, extend: list[int], decode: list[int], context: int,
                tokens: list[int], bs: list[int]) -> dict:
    from cgtool.attention import make_backend
    from cgtool.capture.session import resolve_model
    from cgtool.model.loader import build_model
    from cgtool.model.moe import use_moe_backend
    from cgtool.runtime.engine import ModelRunner, decode_batch, extend_batch
    from cgtool.runtime.kv import KVPool
    from cgtool.verify.session import release_gpu

    cfg, _ = resolve_model(name, random_weights=True)
    width = max(extend + tokens + [context + 2])
    model = build_model(cfg, device="cuda", dtype=torch.bfloat16, max_positions=width + 1, seed=0)
    use_moe_backend(model, "triton")
    weights = torch.cuda.memory_allocated()
    pool = KVPool(cfg, kv_tokens, max(decode + bs) + 2, width + 1, torch.bfloat16, "cuda")
    rows, w = pool.req_to_token.shape
    pool.req_to_token.copy_((torch.arange(rows * w, device="cuda").view(rows, w) % (kv_tokens - 1)) + 1)
    runner = ModelRunner(model, pool, make_backend("triton", cfg.num_heads, cfg.head_dim))
    out = {"model": name, "weights_bytes": weights, "kv_tokens": kv_tokens, "extend": {}, "decode": {}}
    gen = torch.Generator().manual_seed(0)

    def peak(batch, last_only: bool) -> tuple[int, int]:
        torch.cuda.synchronize()
        base, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        hidden = runner.forward_eager(batch)
        logits = model.compute_logits(hidden[-1:] if last_only else hidden)
        torch.cuda.synchronize()
        del hidden, logits
        return torch.cuda.max_memory_allocated() - base, torch.cuda.max_memory_reserved() - base_reserved

    for n in extend:
        ids = torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()
        alloc, reserved = peak(extend_batch(pool, [1], [0], [ids]), True)
        out["extend"][n] = {"activation_bytes": alloc, "reserved_growth_bytes": reserved}
    for requests in decode:
        ids = torch.randint(0, cfg.vocab_size, (requests,), generator=gen).tolist()
        alloc, reserved = peak(decode_batch(pool, range(1, requests + 1), [context] * requests, ids), False)
        out["decode"][requests] = {"activation_bytes": alloc, "reserved_growth_bytes": reserved}
    out["fragmentation_bytes"] = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    out["graphs"] = [capture_pass(runner, tokens, bs) for _ in range(2)]
    del runner, model, pool
    release_gpu()
    return out


def capture_pass(runner, tokens: list[int], bs: list[int]) -> dict:
    """Piecewise then decode sizes, largest first, into a fresh pool: after each size the pool's
    bytes and the memory outside torch. Run twice in one process, the second pass shows the
    graphs alone; the first adds what a process loads once (kernel modules, workspaces)."""
    from cgtool.capture.memory import read_memory
    from cgtool.runners.decode import DecodeGraphRunner
    from cgtool.runners.piecewise import PiecewiseGraphRunner
    from cgtool.runners.pool import get_global_graph_memory_pool, reset_global_graph_memory_pool

    torch._dynamo.reset()  # the compiled body of an earlier pass holds its graphs
    gc.collect()
    torch.cuda.empty_cache()
    reset_global_graph_memory_pool()
    pool = get_global_graph_memory_pool()
    start = read_memory(pool)
    rows = []

    def step(kind):
        def record_and_read(index, size, record):
            record()
            r = read_memory(pool)
            rows.append({"kind": kind, "size": size, "pool_bytes": r.pool_bytes - start.pool_bytes,
                         "non_torch_bytes": r.non_torch_bytes - start.non_torch_bytes,
                         "reserved_bytes": r.reserved_bytes - start.reserved_bytes})
            return True
        return record_and_read

    piecewise = PiecewiseGraphRunner(runner, tokens)
    piecewise.warmup()
    warm = read_memory(pool)
    piecewise.capture(step("piecewise"))
    decode = DecodeGraphRunner(runner, bs)
    decode.capture(step("decode"))
    static = piecewise.static_buffer_bytes + decode.static_buffer_bytes
    del piecewise, decode
    return {"after_warmup_non_torch_bytes": warm.non_torch_bytes - start.non_torch_bytes,
            "static_buffer_bytes": static, "sizes": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama-3.1-8b,qwen3-30b-a3b,deepseek-v2-lite")
    ap.add_argument("--kv-tokens", type=int, default=40_000)
    ap.add_argument("--extend", default="2048,8192")
    ap.add_argument("--decode", default="64,256")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--tokens", default="8192,4096,2048,512", help="piecewise sizes captured")
    ap.add_argument("--bs", default="256,128,32,1", help="decode sizes captured")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    extend = [int(x) for x in args.extend.split(",")]
    decode = [int(x) for x in args.decode.split(",")]
    result = {"gpu": torch.cuda.get_device_name(0), "total_bytes": torch.cuda.mem_get_info()[1],
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    result["device"] = device_parts([256, 1024], [128256, 151936])
    print(json.dumps(result["device"]), flush=True)
    result["models"] = []
    for name in args.models.split(","):
        start = time.time()
        try:
            parts = model_parts(name, args.kv_tokens, extend, decode, args.context,
                                [int(x) for x in args.tokens.split(",")], [int(x) for x in args.bs.split(",")])
        except Exception as exc:  # one model's failure must not lose the others' figures
            parts = {"model": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            from cgtool.verify.session import release_gpu

            del exc
            release_gpu()
        parts["wall_s"] = round(time.time() - start, 1)
        print(json.dumps(parts), flush=True)
        result["models"].append(parts)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
