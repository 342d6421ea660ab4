"""GPU time of decode attention (llama-3.1-8b heads) per call, 32 calls in one CUDA graph,
at bs 1/8/64 and context 1025; run under each tree (PYTHONPATH)."""
import sys, torch
sys.path.insert(0, "tests")
from test_triton_decode import random_pool, random_q
from cgtool.attention.triton_backend import TritonAttentionBackend
from cgtool.engine import decode_batch
res = {}
for bs, ctx in [(1, 1025), (1, 8193), (8, 1025), (64, 1025)]:
    pool, rows = random_pool([ctx] * bs, 32, 8, 128, torch.bfloat16, "cuda")
    batch = decode_batch(pool, rows, [ctx - 1] * bs, [0] * bs)
    q = random_q(bs, 32, 128, torch.bfloat16, "cuda"); out = torch.empty_like(q)
    be = TritonAttentionBackend(32, 128)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(2): be.forward(q, out, 0, batch, pool)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(32): be.forward(q, out, 0, batch, pool)
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(5): g.replay()
    times = []
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize(); times.append(a.elapsed_time(b) * 1e3 / 32)
    times.sort()
    res[f"bs{bs}_ctx{ctx}"] = round(times[len(times) // 2], 2)
print(sys.argv[1], res)
