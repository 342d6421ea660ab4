"""Does decode attention give bitwise the same output at 32 and 64 splits when the chunks are
the same (short sequences)? Run with PYTHONPATH at each tree."""
import sys, torch
sys.path.insert(0, "tests")
from test_triton_decode import random_pool, random_q
from cgtool.attention.triton_backend import TritonAttentionBackend
from cgtool.engine import decode_batch
seq_lens = [300, 17, 1000, 64, 5, 999, 1, 512, 33, 300, 200, 100, 250]
pool, rows = random_pool(seq_lens, 14, 2, 64, torch.bfloat16, "cuda")
batch = decode_batch(pool, rows, [n - 1 for n in seq_lens], [0] * len(rows))
q = random_q(len(rows), 14, 64, torch.bfloat16, "cuda")
outs = {}
for s in (16, 32, 64):
    out = torch.empty_like(q)
    TritonAttentionBackend(14, 64, num_kv_splits=s).forward(q, out, 0, batch, pool)
    outs[s] = out
for s in (16, 32):
    d = (outs[s].float() - outs[64].float()).abs()
    print(sys.argv[1], f"splits {s} vs 64: max diff {d.max().item():.3g}, rows differing {(d.amax(1) > 0).nonzero().flatten().tolist()}")
