"""Issue 33: what one 64-key tile of MLA decode's products costs on Hopper's tensor cores, by shape.

docs/moe-mla.md section 5 found stage 1's products taking about 1.37 us a 64-key tile on the
H200 where a program holds four tiles, 82-89% of its share of the read at the short shapes. A
tile is 68 warpgroup MMAs of 64 x 16 x 16 (`gluon_mla_wgmma`: the 16 heads are N). This times
the MMAs alone, on operands already in shared memory, one program an SM, each form a loop of
ROUNDS tiles with a wait after each product as the kernel has:

- `scores_t`: S^T [64 keys, 16 heads] = rows [64, 576] . q^T (36 MMAs, N = 16), as shipped;
- `output_t`: O^T [512, 16] += rows^T [512, 64] . P^T [64, 16] (32 MMAs, N = 16), as shipped;
- `tile_t`: both, one after the other: the shipped tile's products;
- `scores_padded`: S [64, 64 keys] = q [64 rows, 16 of them heads] . rows^T (36 MMAs, N = 64),
  the heads padded to the MMA's 64 rows as FlashMLA pads them;
- `output_padded`: O [64, 512] += P [64, 64] . rows [64, 512] over two warpgroups (N = 256 each);
- `tile_padded`: both, on two warpgroups: a tile in the padded form;
- `tile_t_synced`: `tile_t` with the shipped loop's barriers and its two proxy fences a tile
  (after the copies' wait, and after P^T's store, which it makes from the scores);
- `tile_t_synced_load`: that, with a global load issued before the first fence and used only
  after the tile, as the shipped loop loads the slots of the tile after next (Triton's proxy
  fence is a `MEMBAR.ALL.CTA` in SASS, which may wait for it);
- `tile_t_softmax`: the tile step with a running maximum (`gluon_mla_wgmma._attend_tile_t`:
  products, online softmax, P^T's store), on rows already in shared memory; shipped until
  2026-11-28 evening, since then the fallback's step;
- `tile_t_stale_max`: the step shipped since (`gluon_mla_wgmma._attend_tile_fixed_t`): scaled by
  a maximum held for the chunk, no maximum across warps and no rescale of the output. Until
  2026-11-28 evening (results before then) this form was a copy of it that also counted, element
  by element, the scores past that maximum by more than 8 (log2).

Each form reports us a tile (the loop's time over ROUNDS) and the multiply-adds of the 16 real
heads a second as a share of `torch.mm`'s bf16 rate (so the padded forms' ceiling is 25%).

    python3 benchmarks/bench_wgmma_shapes.py --out shapes.json [--rounds 2000]
"""

from __future__ import annotations

import argparse
import sys

import torch
from bench_moe_mla import log, mm_flops, save_results

from cgtool.attention import gluon_mla

gluon = gluon_mla.gluon
KEYS, HEADS, RANK, ROPE, PADDED = 64, 16, 512, 64, 64
# name: (form, warps). Forms: 0 scores^T, 1 output^T, 2 both; 3 scores padded, 4 output padded, 5 both.
FORMS = {"scores_t": (0, 4), "output_t": (1, 4), "tile_t": (2, 4),
         "scores_padded": (3, 8), "output_padded": (4, 8), "tile_padded": (5, 8),
         "tile_t_synced": (6, 4), "tile_t_synced_load": (7, 4), "tile_t_softmax": (8, 4),
         "tile_t_stale_max": (9, 4)}
LOADED = 1 << 22  # values the load of form 7 walks through, 8 MiB: L2's, not L1's

if gluon is not None:
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from cgtool.attention.gluon_mla import cta_barrier, gl
    from cgtool.attention.gluon_mla_wgmma import _attend_tile_fixed_t, _attend_tile_t

    # The kernels' sizes as constexprs (a jit function reads no other global).
    C_KEYS, C_HEADS, C_RANK, C_ROPE, C_PADDED, C_LOADED = (
        gl.constexpr(v) for v in (KEYS, HEADS, RANK, ROPE, PADDED, LOADED))

    @gluon.jit
    def _filled(Src, shape0: gl.constexpr, shape1: gl.constexpr, layout: gl.constexpr, WARPS: gl.constexpr):
        """A [shape0, shape1] shared buffer filled from Src's first values (row-major)."""
        blocked: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
        rows = gl.arange(0, shape0, layout=gl.SliceLayout(1, blocked))
        cols = gl.arange(0, shape1, layout=gl.SliceLayout(0, blocked))
        values = gl.load(Src + rows[:, None] * shape1 + cols[None, :])
        return gl.allocate_shared_memory(Src.dtype.element_ty, [shape0, shape1], layout, values)

    @gluon.jit
    def _transposed_forms(Src, Out, rounds, FORM: gl.constexpr, WARPS: gl.constexpr):
        """Forms 0-2 on one warpgroup: heads as N."""
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, C_HEADS, 16])
        swizzled: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        rows = _filled(Src, C_KEYS, C_RANK, swizzled, WARPS)
        pe = _filled(Src, C_KEYS, C_ROPE, swizzled, WARPS)
        q_r = _filled(Src, C_HEADS, C_RANK, gl.NVMMASharedLayout.get_default_for([C_HEADS, C_RANK], Src.dtype.element_ty), WARPS)
        q_p = _filled(Src, C_HEADS, C_ROPE, gl.NVMMASharedLayout.get_default_for([C_HEADS, C_ROPE], Src.dtype.element_ty), WARPS)
        p_t = _filled(Src, C_KEYS, C_HEADS, gl.NVMMASharedLayout.get_default_for([C_KEYS, C_HEADS], Src.dtype.element_ty), WARPS)
        fence_async_shared()
        s = gl.zeros([C_KEYS, C_HEADS], gl.float32, mma)
        acc = gl.zeros([C_RANK, C_HEADS], gl.float32, mma)
        lanes: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
        sink = gl.zeros([32 * WARPS], gl.float32, lanes)
        walk = gl.program_id(0) * 4096 + gl.arange(0, 32 * WARPS, layout=lanes)
        for i in range(rounds):
            if FORM == 7:  # issued before the fence, used after the tile
                loaded = gl.load(Src + (walk + i * 256 * 132) % C_LOADED)
            if FORM >= 6:
                cta_barrier()
                fence_async_shared()
                cta_barrier()
            if FORM != 1:
                s = warpgroup_mma(rows, q_r.permute((1, 0)), s, use_acc=False, is_async=True)
                s = warpgroup_mma(pe, q_p.permute((1, 0)), s, is_async=True)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            if FORM >= 6:
                p_t.store(s.to(p_t.dtype))
                fence_async_shared()
                cta_barrier()
            if FORM != 0:
                acc = warpgroup_mma(rows.permute((1, 0)), p_t, acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            if FORM == 7:
                sink += loaded.to(gl.float32)
        _keep(Out, gl.sum(gl.sum(s, 1), 0) + gl.sum(gl.sum(acc, 1), 0) + gl.sum(sink, 0))

    @gluon.jit
    def _softmax_forms(Src, Out, rounds, FORM: gl.constexpr, WARPS: gl.constexpr):
        """Forms 8-9: whole tile steps, with a running maximum and with a fixed one."""
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, C_HEADS, 16])
        swizzled: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        dtype: gl.constexpr = Src.dtype.element_ty
        rows = _filled(Src, C_KEYS, C_RANK, swizzled, WARPS)
        pe = _filled(Src, C_KEYS, C_ROPE, swizzled, WARPS)
        q_r = _filled(Src, C_HEADS, C_RANK, gl.NVMMASharedLayout.get_default_for([C_HEADS, C_RANK], dtype), WARPS)
        q_p = _filled(Src, C_HEADS, C_ROPE, gl.NVMMASharedLayout.get_default_for([C_HEADS, C_ROPE], dtype), WARPS)
        p_smem = gl.allocate_shared_memory(dtype, [C_KEYS, C_HEADS],
                                           gl.NVMMASharedLayout.get_default_for([C_KEYS, C_HEADS], dtype))
        fence_async_shared()
        acc_t = gl.zeros([C_RANK, C_HEADS], gl.float32, mma)
        l_t = gl.zeros([C_KEYS, C_HEADS], gl.float32, mma)
        m_i = gl.zeros([C_HEADS], gl.float32, gl.SliceLayout(0, mma))
        for i in range(rounds):
            cta_barrier()
            fence_async_shared()
            cta_barrier()
            if FORM == 8:
                acc_t, l_t, m_i = _attend_tile_t(acc_t, l_t, m_i, q_r, q_p, rows, pe, p_smem, i * C_KEYS,
                                                 (i + 1) * C_KEYS, 0.01, C_HEADS, C_KEYS, mma)
            else:
                acc_t, l_t = _attend_tile_fixed_t(acc_t, l_t, m_i, q_r, q_p, rows, pe, p_smem, i * C_KEYS,
                                                  (i + 1) * C_KEYS, 0.01, C_HEADS, C_KEYS, mma)
        _keep(Out, gl.sum(gl.sum(acc_t, 1), 0) + gl.sum(gl.sum(l_t, 1), 0) + gl.sum(m_i, 0))

    @gluon.jit
    def _padded_forms(Src, Out, rounds, FORM: gl.constexpr, WARPS: gl.constexpr):
        """Forms 3-5 on two warpgroups: heads padded to 64 rows as M."""
        scores: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                         instr_shape=[16, C_KEYS // 2, 16])
        output: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                         instr_shape=[16, C_RANK // 2, 16])
        swizzled: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        rows = _filled(Src, C_KEYS, C_RANK, swizzled, WARPS)
        pe = _filled(Src, C_KEYS, C_ROPE, swizzled, WARPS)
        q_r = _filled(Src, C_PADDED, C_RANK, swizzled, WARPS)
        q_p = _filled(Src, C_PADDED, C_ROPE, swizzled, WARPS)
        p = _filled(Src, C_PADDED, C_KEYS, swizzled, WARPS)
        fence_async_shared()
        s = gl.zeros([C_PADDED, C_KEYS], gl.float32, scores)
        acc = gl.zeros([C_PADDED, C_RANK], gl.float32, output)
        for _ in range(rounds):
            if FORM != 4:
                s = warpgroup_mma(q_r, rows.permute((1, 0)), s, use_acc=False, is_async=True)
                s = warpgroup_mma(q_p, pe.permute((1, 0)), s, is_async=True)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            if FORM != 3:
                acc = warpgroup_mma(p, rows, acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _keep(Out, gl.sum(gl.sum(s, 1), 0) + gl.sum(gl.sum(acc, 1), 0))

    @gluon.jit
    def _keep(Out, total):
        """One value a program, so that no product is left out as unused."""
        gl.store(Out + gl.program_id(0), total)

    @gluon.jit
    def _mma_shapes(Src, Out, rounds, FORM: gl.constexpr, WARPS: gl.constexpr):
        if FORM >= 8:
            _softmax_forms(Src, Out, rounds, FORM, WARPS)
        elif FORM < 3 or FORM >= 6:
            _transposed_forms(Src, Out, rounds, FORM, WARPS)
        else:
            _padded_forms(Src, Out, rounds, FORM, WARPS)


def form_us(form: int, warps: int, rounds: int, programs: int) -> float:
    """Microseconds a tile of `form`: one launch of `programs` programs over `rounds` tiles,
    timed with CUDA events (median of 5), divided by `rounds`."""
    src = torch.randn(LOADED, device="cuda").to(torch.bfloat16) / 8
    out = torch.empty(programs, device="cuda", dtype=torch.float32)

    def launch() -> None:
        _mma_shapes[(programs,)](src, out, rounds, FORM=form, WARPS=warps, num_warps=warps)

    launch()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / rounds)
    return sorted(times)[2]


def useful_macs(name: str) -> int:
    """Multiply-adds of the 16 real heads in one tile of this form."""
    scores, output = KEYS * HEADS * (RANK + ROPE), RANK * HEADS * KEYS
    return {"scores": scores, "output": output, "tile": scores + output}[name.split("_")[0]]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=2000, help="tiles each program's loop runs")
    args = parser.parse_args()
    if not torch.cuda.is_available() or gluon is None:
        print("bench_wgmma_shapes.py needs a Hopper GPU and Triton's Gluon", file=sys.stderr)
        return 1
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    peak = mm_flops() / 2 / programs  # multiply-adds a second, one SM
    result: dict = {"device": torch.cuda.get_device_name(), "programs": programs, "rounds": args.rounds,
                    "mm_macs_s_per_sm": peak, "forms": {}}
    log(f"{result['device']}: {programs} programs, torch.mm {peak * 2 * programs / 1e12:.0f} TFLOP/s")
    for name, (form, warps) in FORMS.items():
        us = form_us(form, warps, args.rounds, programs)
        share = useful_macs(name) / (us * 1e-6) / peak
        result["forms"][name] = {"us_a_tile": us, "useful_share_of_mm": share, "warps": warps}
        save_results(result, args.out)
        log(f"{name}: {us:.3f} us a tile, the real heads' MACs at {share:.1%} of torch.mm's rate")
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
