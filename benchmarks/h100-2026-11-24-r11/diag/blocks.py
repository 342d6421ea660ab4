"""Host time of each block of an eager 8B decode layer (bs 1), the layer's code inlined with
timestamps; medians over 32 layers x 20 steps."""
import statistics, sys, time
from collections import defaultdict
import torch
from cgtool.capture.workbench import build_workbench
from cgtool.config import load_model_config
from cgtool.attention.op import attention_over_stored, stores_with_rope
from cgtool.batch import get_forward_context, scratch_empty
from cgtool.model.fused import apply_rope_and_store
from cgtool.model import llama

cfg = load_model_config("llama-3.1-8b")
bench = build_workbench(cfg, weights_dir=None, dtype=torch.bfloat16, mem_fraction_static=0.85,
                        max_bs=1, max_tokens=16, context_len=1024, seed=0)
batch = bench.decode_batch(1)
T = defaultdict(list)
pc = time.perf_counter

def attn_forward(self, positions, x):
    t0 = pc()
    cfg, n = self.cfg, x.shape[0]
    qkv = self.qkv_proj(x)
    t1 = pc()
    q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
    q = q.view(n, cfg.num_heads, cfg.head_dim)
    k = k.view(n, cfg.num_kv_heads, cfg.head_dim)
    out = scratch_empty("attention_out", (n, cfg.q_size), q.dtype, q.device)
    ok = stores_with_rope(q)
    ctx = get_forward_context()
    pool, layer = ctx.kv_pool, self.layer_id
    t2 = pc()
    q = apply_rope_and_store(q, k, v, positions, self.rotary.cos_sin, pool.k_buffers[layer],
                             pool.v_buffers[layer], ctx.batch.out_cache_loc)
    t3 = pc()
    attention_over_stored(q.view(n, cfg.q_size), out, layer)
    t4 = pc()
    r = self.o_proj(out)
    t5 = pc()
    T["qkv_mm"].append(t1 - t0); T["split_view_scratch_ctx"].append(t2 - t1); T["rope_store"].append(t3 - t2)
    T["attention"].append(t4 - t3); T["o_mm"].append(t5 - t4)
    return r

def layer_forward(self, positions, hidden, residual):
    t0 = pc()
    if residual is None:
        residual, hidden = hidden, self.input_layernorm(hidden)
    else:
        hidden, residual = self.input_layernorm(hidden, residual)
    t1 = pc()
    hidden = self.self_attn(positions, hidden)
    t2 = pc()
    hidden, residual = self.post_attention_layernorm(hidden, residual)
    t3 = pc()
    gu = self.mlp.gate_up_proj(hidden)
    t4 = pc()
    from cgtool.model.fused import silu_and_mul
    a = silu_and_mul(gu)
    t5 = pc()
    o = self.mlp.down_proj(a)
    t6 = pc()
    T["norm1"].append(t1 - t0); T["attn_total"].append(t2 - t1); T["norm2"].append(t3 - t2)
    T["gate_up_mm"].append(t4 - t3); T["silu"].append(t5 - t4); T["down_mm"].append(t6 - t5)
    T["layer"].append(t6 - t0)
    return o, residual

def step():
    hidden = bench.runner.forward_eager(batch)
    return bench.runner.model.compute_logits(hidden)

for _ in range(3): step()
plain = []
for _ in range(10):
    torch.cuda.synchronize(); t = pc(); step(); plain.append(pc() - t)
torch.cuda.synchronize()
llama.Attention.forward = attn_forward
llama.DecoderLayer.forward = layer_forward
for _ in range(3): step()
T.clear()
whole = []
for _ in range(20):
    torch.cuda.synchronize(); t = pc(); step(); whole.append(pc() - t)
torch.cuda.synchronize()
print(f"step (plain) {statistics.median(plain)*1e3:.2f} ms; instrumented {statistics.median(whole)*1e3:.2f} ms")
for k, v in T.items():
    print(f"{k:26s} {statistics.median(v)*1e6:7.1f} us")
