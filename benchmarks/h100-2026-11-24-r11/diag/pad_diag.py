"""Why padded replay (bs 13 in the bs-16 graph) differs from eager at bs 13: eager at 13
against eager over the padded 16 rows, on the default stream and on a side stream; then the
replay; per-row max diff of the logits, and of each layer's output for the first layer that differs."""
import torch
from cgtool.capture.workbench import build_workbench
from cgtool.config import load_model_config
from cgtool.runners.decode import DecodeGraphRunner
from cgtool.model import llama

cfg = load_model_config("qwen2.5-0.5b")
bench = build_workbench(cfg, weights_dir=None, dtype=torch.bfloat16, mem_fraction_static=0.5,
                        max_bs=16, max_tokens=64, context_len=300, seed=0, kv_tokens=8192)
runner = DecodeGraphRunner(bench.runner, [1, 2, 4, 8, 16])
model = bench.runner.model
batch = bench.decode_batch(13)
outs = []
orig = llama.DecoderLayer.forward
def rec(self, positions, hidden, residual):
    h, r = orig(self, positions, hidden, residual)
    outs.append(h.clone()); return h, r
llama.DecoderLayer.forward = rec
e13 = model.compute_logits(bench.runner.forward_eager(batch)); l13 = outs[:]; outs.clear()
runner.load_inputs(batch)
e16 = model.compute_logits(bench.runner.forward_eager(runner.static_batch(16))); l16 = outs[:]; outs.clear()
llama.DecoderLayer.forward = orig
def rows(a, b):
    d = (a[:13].float() - b[:13].float()).abs().amax(1)
    return [round(float(x), 4) for x in d]
print("logits eager13 vs eager16-padded per row:", rows(e13, e16))
for i, (a, b) in enumerate(zip(l13, l16)):
    r = rows(a, b)
    if max(r) > 0:
        print("first differing layer", i, r); break
# mm alone at M=13 vs M=16
x = torch.randn(16, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
for name, mod in [("qkv", model.model.layers[0].self_attn.qkv_proj), ("o", model.model.layers[0].self_attn.o_proj),
                  ("gate_up", model.model.layers[0].mlp.gate_up_proj), ("down", model.model.layers[0].mlp.down_proj), ("lm_head", None)]:
    w = model.lm_head.weight if mod is None else mod.weight
    xin = x if w.shape[1] == x.shape[1] else torch.randn(16, w.shape[1], device="cuda", dtype=torch.bfloat16)
    a = torch.mm(xin[:13], w.t()); b = torch.mm(xin, w.t())[:13]
    print("mm", name, "M=13 vs M=16 max diff", float((a.float() - b.float()).abs().max()))
runner.capture()
rep = runner.replay(batch).clone()
print("replay16 vs eager13:", rows(rep, e13))
print("replay16 vs eager16-padded:", rows(rep, e16))
