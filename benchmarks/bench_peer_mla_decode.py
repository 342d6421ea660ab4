"""Issue 33: cgtool's MLA decode beside the engine's own kernel, on the same GPU and shapes.

The issue asks for MLA decode "at the engine's speed". This times SGLang's Triton MLA decode
(`decode_attention_fwd` with `has_mla=True`, its stage-1 grouped kernel and stage-2 merge) and
cgtool's `mla_decode_attention` in one process, each as a CUDA graph of LAYERS launches over
distinct latent pools, deepseek-v2-lite's 16 heads over a 576-wide latent at bf16.

SGLang's code is not part of cgtool: pass `--sglang DIR`, a folder holding an unpacked SGLang
wheel (`pip download sglang --no-deps` then unzip). Only three of its files are loaded
(`kernels/ops/attention/{decode_attention,metadata,score_mod}.py`); the few helpers they import
from the rest of SGLang are stood in for here with what they return on an NVIDIA GPU.

For each case the engine runs as its Triton backend sets it up on this GPU:
- `max_kv_splits` is the backend's MLA cap for deepseek-v2-lite's 163,840-token context
  (`_mla_decode_kv_splits_cap`: the SM count rounded up to a power of two), so the grid is
  batch x 1 x max_kv_splits and programs past a request's split count return at once;
- each request's split count comes from the backend's scheduler kernel
  (`get_num_kv_splits_triton`), run before the graph as the backend runs it before a replay;
- dependent launches (PDL) on, as `is_arch_support_pdl` turns them on from sm_90.
It is also timed at every uniform split count in SPLITS, to show its best. Each output is
compared with cgtool's (max |diff|), so both compute the same attention.

    python3 benchmarks/bench_peer_mla_decode.py --sglang /path/to/unpacked --out peer.json [--dry]

--dry runs two tiny cases in fp32 through Triton's interpreter on the CPU (TRITON_INTERPRET=1):
the setup and the comparison, timings meaningless.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from pathlib import Path

import bench_moe_mla as bench
import torch

from cgtool.attention.triton_mla import mla_decode_attention, mla_num_kv_splits

CASES = [(1, 1024), (16, 1024), (32, 1024), (64, 1024), (128, 1024), (256, 1024),
         (1, 8192), (16, 8192), (32, 8192), (64, 8192)]
SPLITS = (1, 2, 4, 8, 16, 32, 64)
CONTEXT_LEN = 163_840  # deepseek-v2-lite's max_position_embeddings
SCALE = 0.07
USE_PDL = True  # the backend's is_arch_support_pdl() from sm_90; the interpreter has no PDL
ATTENTION = "sglang/kernels/ops/attention"


def stand_ins(sm_count: int) -> dict[str, types.ModuleType]:
    """The SGLang modules decode_attention.py imports besides its own folder, as they answer
    on an NVIDIA GPU: not HIP, no gfx9 tuning, environment switches off."""
    utils = types.ModuleType("sglang.srt.utils")
    utils.is_hip = lambda: False
    utils.is_gfx95_supported = lambda: False
    utils.is_gfx1250_supported = lambda: False
    utils.get_device_core_count = lambda device_id=0: sm_count

    class Switch:
        def get(self) -> bool:
            return False

    environ = types.ModuleType("sglang.srt.environ")
    environ.envs = types.SimpleNamespace(
        SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS=Switch(), SGLANG_MLA_DECODE_TUNE=Switch())
    return {"sglang.srt.utils": utils, "sglang.srt.environ": environ}


def load_sglang(root: Path, sm_count: int) -> tuple[types.ModuleType, types.ModuleType]:
    """(decode_attention, metadata) from an unpacked wheel, without running SGLang's package
    __init__ files (they import the whole server)."""
    folder = root / ATTENTION
    if not (folder / "decode_attention.py").is_file():
        sys.exit(f"--sglang {root}: no {ATTENTION}/decode_attention.py there; unpack an SGLang wheel into it")
    for name, path in [("sglang", root / "sglang"), ("sglang.srt", root / "sglang/srt"),
                       ("sglang.kernels", root / "sglang/kernels"), ("sglang.kernels.ops", root / "sglang/kernels/ops"),
                       ("sglang.kernels.ops.attention", folder)]:
        package = types.ModuleType(name)
        package.__path__ = [str(path)]
        sys.modules[name] = package
    sys.modules.update(stand_ins(sm_count))
    loaded = []
    for name in ("score_mod", "metadata", "decode_attention"):
        spec = importlib.util.spec_from_file_location(f"sglang.kernels.ops.attention.{name}", folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        loaded.append(module)
    return loaded[2], loaded[1]


def engine_max_splits(sm_count: int) -> int:
    """triton_backend._mla_decode_kv_splits_cap(8, sm_count, CONTEXT_LEN), min block 32."""
    sm_cap = 1 << (sm_count - 1).bit_length()
    ctx_cap = 1 << (-(-CONTEXT_LEN // 32) - 1).bit_length()
    return max(8, min(sm_cap, ctx_cap))


def engine_splits(metadata, seq_lens: torch.Tensor, max_splits: int, sm_count: int) -> torch.Tensor:
    """Each request's split count as SGLang's Triton backend picks it (get_num_kv_splits)."""
    splits = torch.empty_like(seq_lens)
    num_seq = seq_lens.shape[0]
    schedule = 256 if num_seq < 256 else 1 << (num_seq - 1).bit_length()
    metadata.get_num_kv_splits_triton[(1,)](
        splits, seq_lens, num_seq, 1, bench.MLA_HEADS, 1, max_splits, sm_count, MAX_NUM_SEQ=schedule)
    return splits


def peer_case(decode_attention, metadata, bs: int, ctx: int, copy_bs: float, sm_count: int,
              splits_tried: tuple[int, ...] = SPLITS) -> dict:
    layers = 2 if bs * ctx >= 64 * 8192 else bench.LAYERS
    device, dtype = bench.DEVICE, bench.DTYPE
    caches, r2t, rows = bench.latent_setup([ctx] * bs, layers)
    seq_lens = torch.full((bs,), ctx, dtype=torch.int32, device=device)
    q = torch.randn(bs, bench.MLA_HEADS, bench.RANK + bench.ROPE, device=device).to(dtype)
    ours, theirs = (torch.empty(bs, bench.MLA_HEADS, bench.RANK, device=device, dtype=dtype) for _ in range(2))
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=device)
    kv_indptr[1:] = torch.cumsum(seq_lens, 0)
    kv_indices = r2t[1:, :ctx].reshape(-1).to(torch.int64)
    max_splits = engine_max_splits(sm_count)

    def engine(splits: torch.Tensor, grid_splits: int):
        # Contiguous, as the backend allocates them: stage 2 finds a chunk's log-sum-exp at its
        # partial's offset divided by the value width.
        logits = torch.empty(bs, bench.MLA_HEADS, grid_splits, bench.RANK, dtype=torch.float32, device=device)
        lse = torch.empty(bs, bench.MLA_HEADS, grid_splits, dtype=torch.float32, device=device)

        def run():
            for cache in caches:
                decode_attention.decode_attention_fwd(
                    q, cache, cache[..., :bench.RANK], theirs, kv_indptr, kv_indices, logits, lse, splits,
                    grid_splits, SCALE, 1.0, 1.0, has_mla=True, use_pdl=USE_PDL)
        return run

    def cgtool():
        for cache in caches:
            mla_decode_attention(q, cache, ours, r2t, rows, seq_lens, SCALE, mla_num_kv_splits(bs, bench.MLA_HEADS))

    chosen = engine_splits(metadata, seq_lens, max_splits, sm_count)
    row = {"bs": bs, "context": ctx, "bound_us": bs * ctx * (bench.RANK + bench.ROPE) * dtype.itemsize / copy_bs * 1e6,
           "cgtool_splits": mla_num_kv_splits(bs, bench.MLA_HEADS), "engine_max_kv_splits": max_splits,
           "engine_splits": int(chosen[0])}
    row["cgtool_us"] = bench.graph_us(cgtool) / layers
    row["engine_us"] = bench.graph_us(engine(chosen, max_splits)) / layers
    row["engine_max_diff"] = (ours.float() - theirs.float()).abs().max().item()
    uniform = []
    for n in splits_tried:
        fixed = torch.full_like(seq_lens, n)
        # Grid sized to the count, so no program returns at once: the kernel at its leanest.
        uniform.append({"splits": n, "us": bench.graph_us(engine(fixed, n)) / layers,
                        "max_diff": (ours.float() - theirs.float()).abs().max().item()})
    row["engine_uniform"] = uniform
    row["engine_best_us"] = min(u["us"] for u in uniform)
    row["cgtool_us_again"] = bench.graph_us(cgtool) / layers  # a second timing, for the spread
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sglang", type=Path, required=True, help="folder holding an unpacked SGLang wheel")
    parser.add_argument("--out", default="peer-mla.json")
    parser.add_argument("--cases", default="", help="bs x context pairs, e.g. 64x1024,256x1024")
    parser.add_argument("--dry", action="store_true", help="two tiny cases on the CPU (TRITON_INTERPRET=1)")
    args = parser.parse_args()
    cases = [tuple(int(v) for v in c.split("x")) for c in args.cases.split(",")] if args.cases else CASES
    splits_tried = SPLITS
    if args.dry:
        global USE_PDL
        USE_PDL = False
        bench.DEVICE, bench.DTYPE, bench.LAYERS = "cpu", torch.float32, 2
        cases, splits_tried, sm_count = [(2, 70), (3, 200)], (1, 2, 4), 132
    elif not torch.cuda.is_available():
        sys.exit("bench_peer_mla_decode.py needs a GPU (or --dry with TRITON_INTERPRET=1)")
    else:
        sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    decode_attention, metadata = load_sglang(args.sglang, sm_count)
    copy_bs = bench.copy_bandwidth()
    result = {"device": torch.cuda.get_device_name() if bench.DEVICE == "cuda" else "cpu", "torch": torch.__version__, "sm_count": sm_count,
              "copy_bytes_s": copy_bs, "layers": bench.LAYERS, "cases": []}
    for bs, ctx in cases:
        row = peer_case(decode_attention, metadata, bs, ctx, copy_bs, sm_count, splits_tried)
        result["cases"].append(row)
        bench.save_results(result, args.out)
        bench.log(f"bs {bs} x {ctx}: cgtool {row['cgtool_us']:.1f} / {row['cgtool_us_again']:.1f} us, "
            f"SGLang {row['engine_us']:.1f} us ({row['engine_splits']} splits), best uniform "
            f"{row['engine_best_us']:.1f}; roofline {row['bound_us']:.1f}; max |diff| {row['engine_max_diff']:.2e}")


if __name__ == "__main__":
    main()
