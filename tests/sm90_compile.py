"""Compiles cgtool's attention, layer and MoE Triton kernels for sm_90 (Hopper) with Triton's
NVIDIA backend, which needs no GPU.

Triton's interpreter, which runs the CPU tests, accepts code that the compiler refuses: a helper
returning a scalar on one constexpr branch and a vector on the other ran in the interpreter and
failed to compile on the H100 (2026-11-26). `test_kernels_compile_for_sm90.py` runs this file
in a process without TRITON_INTERPRET, so the `@triton.jit` functions are the compiler's. Each
case prints "compiled NAME"; a failure exits non-zero with the compiler's message.
"""

from __future__ import annotations

import sys

from triton.compiler.errors import CompilationError

from cgtool.attention import (
    gluon_mla,
    gluon_mla_projection,
    gluon_mla_wgmma,
    mla_flat_plan,
    mla_merge_projection,
    triton_decode,
    triton_extend,
    triton_mla,
)
from cgtool.model import (
    fused_kernels,
    fused_launch,
    moe_grouped,
    moe_routing,
    moe_tma_gemm,
    moe_triton,
)
from cgtool.runtime import kv_store
from cgtool.runtime.offline_compile import MULTIPLE_OF_16, compile_for, resource_usage

# Pointer arguments by name; compile_for takes other integers as i32.
POINTERS = {
    "Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "Kv": "*bf16", "MidO": "*fp32", "MidOut": "*fp32",
    "MidLse": "*fp32", "Tickets": "*i32", "Trace": "*fp32", "req_to_token": "*i32", "req_pool_indices": "*i32",
    "prefix_lens": "*i32", "extend_lens": "*i32", "start_loc": "*i32", "seq_lens": "*i32", "Plan": "*i32",
    "X": "*bf16", "R": "*bf16", "W": "*bf16", "Out": "*bf16", "ResOut": "*bf16", "QOut": "*bf16", "KOut": "*bf16",
    "KCache": "*bf16", "VCache": "*bf16", "Loc": "*i64", "positions": "*i64", "cos_sin": "*fp32",
    "Logits": "*fp32", "Weights": "*fp32", "Ids": "*i32", "Counts": "*i32", "Cursor": "*i32",
    "SortedPairIds": "*i32", "BlockExperts": "*i32", "NumPadded": "*i32", "Y": "*fp32",
    "A": "*bf16", "B": "*bf16", "C": "*bf16", "sorted_pair_ids": "*i32", "block_experts": "*i32",
    "num_padded": "*i32", "pair_weights": "*fp32", "Entries": "*i32", "Requests": "*i32", "Redone": "*i32",
}
# qwen3-30b-a3b's experts: 128 of width 768 over a hidden size of 2,048, 8 a token
EXPERTS, TOP_K, HIDDEN, WIDTH = 128, 8, 2048, 768
MLA = {"RANK": 512, "ROPE": 64, "BLOCK_R": 512, "BLOCK_P": 64}
DEFAULT_STAGES = 3  # Triton's, for launches that name none


def cases() -> dict[str, tuple]:
    """name: (kernel, constexprs, num_warps, num_stages[, argument types other than
    POINTERS']), as the backends launch them."""
    _, block_n, warps, stages = triton_extend.launch_config(128)
    dense = {"GROUP": 8, "HEAD_DIM": 128, "BLOCK_D": 128, "BLOCK_N": block_n}
    _, mla_block_n, mla_warps, mla_stages = triton_mla.EXTEND_TILES
    found = {}
    for heads, block_m in ((1, 128), (1, 16), (8, 16), (8, 64)):
        for split in (False, True):
            found[f"extend heads={heads} rows={block_m} split={split}"] = (
                triton_extend._extend_kernel, {**dense, "BLOCK_M": block_m, "SPLIT": split, "HEADS": heads},
                warps, stages)
    for heads, block_m in ((1, 64), (16, 16), (16, 64)):
        for split in (False, True):
            found[f"mla extend heads={heads} rows={block_m} split={split}"] = (
                triton_mla._mla_extend_kernel,
                {**MLA, "BLOCK_M": block_m, "BLOCK_N": mla_block_n, "SPLIT": split, "HEADS": heads},
                mla_warps, mla_stages)
    found["extend merge"] = (triton_extend._extend_merge_kernel,
                             {"HEAD_DIM": 512, "SPLIT_STRIDE": 512, "SLICE_D": 128, "SPLITS_P2": 64}, 4, 1)
    block_n, warps, stages = triton_decode.launch_config()
    for group in (4, 8):
        found[f"decode group={group}"] = (
            triton_decode._decode_stage1,
            {"GROUP": group, "HEAD_DIM": 128, "BLOCK_D": 128, "BLOCK_H": max(triton_decode.MIN_BLOCK_H, group),
             "BLOCK_N": block_n}, warps, stages)
    found["decode chunk plan"] = (triton_decode._chunk_plan_kernel,
                                  {"BLOCK_BS": 64, "CHUNKS": 256, "PER_ROW": 4, "BLOCK_N": block_n}, 4, 1)
    found["decode merge"] = (triton_decode._decode_stage2, {"HEAD_DIM": 128, "BLOCK_D": 128}, 4, 1)
    found.update(mla_decode_cases())
    found.update(layer_cases())
    found.update(routing_cases())
    found.update(expert_gemm_cases())
    found.update(grouped_path_cases())
    return found


def mla_decode_cases() -> dict[str, tuple]:
    """MLA decode's stage 1 merged in its last program (2-8 chunks; bf16 partials at 8 warps, as
    triton_mla.PARTIAL_DTYPE_EIGHT_WARPS_FUSED has them) and followed by the merge kernel (11
    and 16 chunks, releasing it), and the merge kernel over 16 and 64 lanes."""
    found = {}
    fused = [(2, triton_mla.DECODE_TILES_FEW_CHUNKS), (3, triton_mla.DECODE_TILES_FEW_CHUNKS),
             (4, triton_mla.DECODE_TILES), (5, triton_mla.DECODE_TILES), (8, triton_mla.DECODE_TILES)]
    for splits, (block_n, warps, stages) in fused + [(11, triton_mla.DECODE_TILES), (16, triton_mla.DECODE_TILES)]:
        merged_here = splits <= triton_mla.FUSED_MERGE_SPLITS
        # With 4 chunks, the stamps of benchmarks/probe_mla_timeline.py compiled in.
        name = f"mla decode chunks={splits}" + ("" if merged_here else ", merge kernel a dependent")
        found[name] = (
            triton_mla._mla_decode_stage1,
            {**MLA, "NUM_HEADS": 16, "BLOCK_H": triton_mla.BLOCK_H, "BLOCK_N": block_n, "NUM_SPLITS": splits,
             "MIN_CHUNK": triton_mla.FUSED_MIN_CHUNK if merged_here else block_n, "FUSED_MERGE": merged_here,
             "RELEASE": not merged_here, "MERGE_D": triton_mla.MERGE_SLICE, "TRACE": splits == 4},
            warps, stages, {"MidOut": "*bf16"} if merged_here and warps == 8 else {})
    if gluon_mla.gluon is not None:
        block_n, warps, _ = triton_mla.BUFFERED_TILES
        # (chunks, tiles, a dependent launch)
        for splits, buffers, pdl in ((4, triton_mla.BUFFERED_TILES_COUNT, True),
                                     (4, triton_mla.BUFFERED_TILES_COUNT, False),
                                     (16, triton_mla.BUFFERED_TILES_COUNT, True), (1, 3, True)):
            merged_here = splits <= triton_mla.FUSED_MERGE_SPLITS
            found[f"mla decode gluon stage 1 chunks={splits} tiles={buffers} pdl={pdl}"] = (
                gluon_mla._mla_decode_stage1_buffered,
                {"NUM_HEADS": 16, "RANK": 512, "ROPE": 64, "BLOCK_H": triton_mla.BLOCK_H, "BLOCK_N": block_n,
                 "NUM_SPLITS": splits,
                 "MIN_CHUNK": triton_mla.FUSED_MIN_CHUNK if merged_here else triton_mla.BUFFERED_MERGE_KERNEL_MIN_CHUNK,
                 "NUM_BUF": buffers, "WARPS": warps, "FUSED_MERGE": merged_here,
                 "MERGE_D": triton_mla.BUFFERED_MERGE_SLICE, "PDL": pdl,
                 "CHAINS": gluon_mla.score_chains(512, merged_here),
                 "RELEASE": pdl and not merged_here and gluon_mla.RELEASE_MERGE_AT_START},
                warps, 1, {"MidOut": "*bf16"} if merged_here else {})
        block_n, buffers, warps = gluon_mla_wgmma.WGMMA_TILES
        # The last two: the probe's stamps, and the other settings of Q_FIRST, PARTIAL_VEC,
        # ONE_CHUNK_DIRECT, SPARES_FIRST and FLAT_CHUNKS.
        # Q_FIRST as the H100 takes it in the shipped cases, as the H200 does in the other.
        shipped = (False, gluon_mla_wgmma.PARTIAL_VEC, gluon_mla_wgmma.ONE_CHUNK_DIRECT,
                   gluon_mla_wgmma.SPARES_FIRST, gluon_mla_wgmma.FLAT_CHUNKS)
        other = (True, 12 - gluon_mla_wgmma.PARTIAL_VEC, not gluon_mla_wgmma.ONE_CHUNK_DIRECT,
                 not gluon_mla_wgmma.SPARES_FIRST, not gluon_mla_wgmma.FLAT_CHUNKS)
        for splits, batch_block, pdl, trace, (q_first, vec, direct, spares_first, flat) in (
                (4, 128, True, False, shipped), (15, 128, True, False, shipped), (2, 256, False, False, shipped),
                (4, 128, True, True, shipped), (6, 128, True, False, other)):
            found[f"mla decode gluon wgmma stage 1 chunks={splits} batch={batch_block} pdl={pdl} trace={trace} "
                  f"q_first={q_first} vec={vec} direct={direct} spares_first={spares_first} flat={flat}"] = (
                gluon_mla_wgmma._mla_decode_stage1_wgmma,
                {"NUM_HEADS": 16, "RANK": 512, "ROPE": 64, "BLOCK_H": triton_mla.BLOCK_H, "BLOCK_N": block_n,
                 "NUM_SPLITS": splits, "MIN_CHUNK": triton_mla.WGMMA_MIN_CHUNK, "NUM_BUF": buffers,
                 "FUSED_MERGE": True, "MERGE_GROUP": gluon_mla_wgmma.MERGE_GROUP, "PDL": pdl,
                 "BATCH_BLOCK": batch_block, "TRACE": trace,
                 "Q_FIRST": q_first, "PARTIAL_VEC": vec, "ONE_CHUNK_DIRECT": direct,
                 "SPARES_FIRST": spares_first, "FLAT": flat, "ENTRY": mla_flat_plan.ENTRY,
                 "ENTRY_AFTER_WAIT": False, "UNMERGED": False, **gluon_mla_wgmma.fixed_max_constants()},
                warps, 1, {"MidOut": "*bf16", "Trace": "*i64"})
        # Unmerged for the merge in the value projection, which it releases; its entries read
        # after the wait where the plan kernel was launched just before it, else before.
        for after_wait in (False, True):
            found[f"mla decode gluon wgmma stage 1 flat, unmerged for the projection, entry after wait={after_wait}"] = (
                gluon_mla_wgmma._mla_decode_stage1_wgmma,
                {"NUM_HEADS": 16, "RANK": 512, "ROPE": 64, "BLOCK_H": triton_mla.BLOCK_H, "BLOCK_N": block_n,
                 "NUM_SPLITS": 4, "MIN_CHUNK": triton_mla.WGMMA_MIN_CHUNK, "NUM_BUF": buffers, "FUSED_MERGE": False,
                 "MERGE_GROUP": gluon_mla_wgmma.MERGE_GROUP, "PDL": True,
                 "BATCH_BLOCK": 128, "TRACE": False, "Q_FIRST": False,
                 "PARTIAL_VEC": gluon_mla_wgmma.PARTIAL_VEC, "ONE_CHUNK_DIRECT": gluon_mla_wgmma.ONE_CHUNK_DIRECT,
                 "SPARES_FIRST": gluon_mla_wgmma.SPARES_FIRST, "FLAT": True, "ENTRY": mla_flat_plan.ENTRY,
                 "ENTRY_AFTER_WAIT": after_wait, "UNMERGED": True, "EARLY_COPIES": gluon_mla_wgmma.EARLY_COPIES,
                 "RELEASE_AT_START": gluon_mla_wgmma.RELEASE_AT_START,
                 "SLOTS_EARLY": gluon_mla_wgmma.SLOTS_EARLY and not gluon_mla_wgmma.EARLY_COPIES,
                 **gluon_mla_wgmma.fixed_max_constants()},
                warps, 1, {"MidOut": "*bf16", "Trace": "*fp32"})
        # The same with the other setting of EARLY_COPIES (the first tile's copies before the wait).
        shipped_flat = "mla decode gluon wgmma stage 1 flat, unmerged for the projection, entry after wait=False"
        found["mla decode gluon wgmma stage 1 flat, unmerged, early copies other"] = (
            gluon_mla_wgmma._mla_decode_stage1_wgmma,
            {**found[shipped_flat][1], "EARLY_COPIES": not gluon_mla_wgmma.EARLY_COPIES},
            warps, 1, {"MidOut": "*bf16", "Trace": "*fp32"})
        # q's loads first, as the H200 takes them (Q_FIRST by GPU class).
        found["mla decode gluon wgmma stage 1 flat, unmerged, q first"] = (
            gluon_mla_wgmma._mla_decode_stage1_wgmma, {**found[shipped_flat][1], "Q_FIRST": True},
            warps, 1, {"MidOut": "*bf16", "Trace": "*fp32"})
        # A running maximum a tile (the other setting of FIXED_MAX).
        found["mla decode gluon wgmma stage 1 flat, unmerged, fixed maximum other"] = (
            gluon_mla_wgmma._mla_decode_stage1_wgmma,
            {**found[shipped_flat][1], "FIXED_MAX": not gluon_mla_wgmma.FIXED_MAX},
            warps, 1, {"MidOut": "*bf16", "Trace": "*fp32"})
        # Without the count of redone chunks (the other setting of COUNT_REDONE, a benchmark's).
        found["mla decode gluon wgmma stage 1 flat, unmerged, count redone other"] = (
            gluon_mla_wgmma._mla_decode_stage1_wgmma,
            {**found[shipped_flat][1], "COUNT_REDONE": not gluon_mla_wgmma.COUNT_REDONE},
            warps, 1, {"MidOut": "*bf16", "Trace": "*fp32"})
        # The projection released at stage 1's start (the other setting of RELEASE_AT_START).
        found["mla decode gluon wgmma stage 1 flat, unmerged, release at start other"] = (
            gluon_mla_wgmma._mla_decode_stage1_wgmma,
            {**found[shipped_flat][1], "RELEASE_AT_START": not gluon_mla_wgmma.RELEASE_AT_START},
            warps, 1, {"MidOut": "*bf16", "Trace": "*fp32"})
        # The benchmarks' bounds without stage 1's copies or its products.
        for copies, products in ((False, True), (True, False)):
            found[f"mla decode gluon wgmma stage 1 flat, unmerged, copies={copies} products={products}"] = (
                gluon_mla_wgmma._mla_decode_stage1_wgmma,
                {**found[shipped_flat][1], "COPIES": copies, "PRODUCTS": products},
                warps, 1, {"MidOut": "*bf16", "Trace": "*fp32"})
        # The first tile's slots before the wait (the other setting of SLOTS_EARLY).
        found["mla decode gluon wgmma stage 1 flat, unmerged, slots early other"] = (
            gluon_mla_wgmma._mla_decode_stage1_wgmma,
            {**found[shipped_flat][1], "EARLY_COPIES": False, "SLOTS_EARLY": not gluon_mla_wgmma.SLOTS_EARLY},
            warps, 1, {"MidOut": "*bf16", "Trace": "*fp32"})
    found["mla decode flat plan"] = (
        mla_flat_plan._flat_plan_kernel,
        {"BLOCK_N": gluon_mla_wgmma.WGMMA_TILES[0], "MIN_CHUNK": triton_mla.WGMMA_MIN_CHUNK,
         "BATCH_BLOCK": 128, "BLOCK_P": mla_flat_plan.BLOCK_PROGRAMS,
         "ENTRY_INTS": mla_flat_plan.ENTRY, "PDL": True},
        4, 1)
    for pdl, by_slots, traced in ((True, False, False), (False, False, False), (True, True, False),
                                  (True, True, True)):
        found[f"mla decode merge in the value projection pdl={pdl} by slots={by_slots} traced={traced}"] = (
            mla_merge_projection._merge_project_kernel,
            {"RANK": 512, "V": 128, "BLOCK_M": mla_merge_projection.BLOCK_M,
             "BLOCK_V": mla_merge_projection.BLOCK_V, "GROUP": mla_merge_projection.MERGE_GROUP, "PDL": pdl,
             "BY_SLOTS": by_slots, "SLOTS": mla_merge_projection.SLOTS, "TRACE": traced,
             "PRODUCT_T": mla_merge_projection.PRODUCT_T},
            mla_merge_projection.WARPS, mla_merge_projection.SLOT_STAGES if by_slots else 1,
            {"MidOut": "*bf16", "Trace": "*i64"})
    if gluon_mla.gluon is not None:
        for traced in (False, True):
            found[f"mla decode merge in the value projection, gluon, traced={traced}"] = (
                gluon_mla_projection._merge_project_kernel,
                {"RANK": 512, "V": 128, "BLOCK_M": mla_merge_projection.BLOCK_M,
                 "BLOCK_V": mla_merge_projection.BLOCK_V, "SLOTS": gluon_mla_projection.SLOTS, "PDL": True,
                 "TRACE": traced},
                gluon_mla_projection.WARPS, 1, {"MidOut": "*bf16", "Trace": "*i64"})
        # The other setting of PROJECT_FIRST (then one step of slots is merged before the product).
        found["mla decode merge in the value projection, gluon, project first other"] = (
            gluon_mla_projection._merge_project_kernel,
            {**found["mla decode merge in the value projection, gluon, traced=False"][1],
             "PROJECT_FIRST": not mla_merge_projection.PROJECT_FIRST},
            gluon_mla_projection.WARPS, 1, {"MidOut": "*bf16", "Trace": "*i64"})
    for splits, lanes, pdl in ((11, 16, True), (16, 64, False), (16, 64, True)):
        found[f"mla decode merge kernel chunks={splits} lanes={lanes} pdl={pdl}"] = (
            triton_mla._mla_merge_kernel,
            {"RANK": 512, "BLOCK_D": triton_mla.MERGE_SLICE, "BLOCK_N": 64, "NUM_SPLITS": splits, "MIN_CHUNK": 64,
             "LANES": lanes, "PDL": pdl}, 4, 1)
    for splits, lanes in ((16, 16), (32, 32), (64, 64)):  # after gluon_mla's stage 1: wider slices
        columns = triton_mla._merge_slice(triton_mla.BUFFERED_TILES_COUNT, False, lanes)
        found[f"mla decode merge kernel after gluon chunks={splits} columns={columns}"] = (
            triton_mla._mla_merge_kernel,
            {"RANK": 512, "BLOCK_D": columns, "BLOCK_N": triton_mla.BUFFERED_TILES[0], "NUM_SPLITS": splits,
             "MIN_CHUNK": triton_mla.BUFFERED_MERGE_KERNEL_MIN_CHUNK, "LANES": lanes, "PDL": True}, 4, 1)
    return found


def layer_cases() -> dict[str, tuple]:
    """The kernels around attention, with the launch helpers' own constexprs (llama-3.1-8b's
    shapes: hidden 4,096, 32 q heads and 8 KV heads of 128, a fused qkv's offsets)."""
    found = {}
    for dim, residual in ((4096, True), (4096, False), (128, False)):
        meta = dict(fused_launch._norm_meta(dim, residual))
        warps = meta.pop("num_warps")
        found[f"rms norm dim={dim} residual={residual}"] = (fused_kernels._rms_norm_kernel, meta, warps, DEFAULT_STAGES)
    found["rope"] = (fused_kernels._rope_kernel,
                     {"NUM_Q_HEADS": 32, "NUM_K_HEADS": 8, "HALF": 64, "BLOCK_D": 64, "BLOCK_HQ": 32, "BLOCK_HK": 8},
                     4, DEFAULT_STAGES)
    for k_offset in (0, 32 * 128):
        meta = dict(fused_launch._rope_store_meta(32, 8, 128, k_offset))
        warps = meta.pop("num_warps")
        found[f"rope and store k_offset={k_offset}"] = (fused_kernels._rope_store_kernel, meta, warps, DEFAULT_STAGES)
    found["silu and mul"] = (fused_kernels._silu_and_mul_kernel, {"BLOCK": fused_launch.SILU_BLOCK}, 4, DEFAULT_STAGES)
    for has_v, release in ((True, True), (False, True), (False, False)):
        found[f"store kv v={has_v} release={release}"] = (
            kv_store._store_kv_kernel, {"HAS_V": has_v, "BLOCK": kv_store.STORE_BLOCK, "RELEASE": release},
            4, DEFAULT_STAGES)
    return found


def routing_cases() -> dict[str, tuple]:
    """The router's logits, the top-k and the alignment, as moe_routing sizes them."""
    found = {}
    for block_t, block_e in ((16, 16), (64, 64)):
        found[f"router rows={block_t}"] = (moe_routing._router_kernel, {
            "NUM_EXPERTS": EXPERTS, "PRECISION": "tf32", "BLOCK_T": block_t, "BLOCK_E": block_e, "BLOCK_K": 128},
            4, DEFAULT_STAGES)
    for block_t in (1, 16):
        found[f"route top-k rows={block_t}"] = (moe_routing._route_kernel, {
            "NUM_EXPERTS": EXPERTS, "BLOCK_E": EXPERTS, "TOP_K": TOP_K, "BLOCK_K": TOP_K, "RENORM": True,
            "BLOCK_T": block_t}, 4, DEFAULT_STAGES)
    for pdl in (False, True):
        found[f"router and route, one token, dependent={pdl}"] = (moe_routing._router_route_kernel, {
            "NUM_EXPERTS": EXPERTS, "BLOCK_E": EXPERTS // moe_routing.ROUTER_ROUTE_PROGRAMS,
            "BLOCK_K": moe_routing.ROUTER_ROUTE_K, "ALL_EXPERTS": EXPERTS, "TOP_K": TOP_K, "RENORM": True, "PDL": pdl},
            moe_routing.ROUTER_ROUTE_WARPS, DEFAULT_STAGES)
    align = {"NUM_EXPERTS": EXPERTS, "BLOCK_E": EXPERTS, "BLOCK_M": 16, "BLOCKS_BLOCK": moe_routing.BLOCKS_BLOCK}
    found["align in one program"] = (moe_routing._align_one_program, {**align, "BLOCK": moe_routing.PAIRS_BLOCK},
                                     4, DEFAULT_STAGES)
    found["align: count"] = (moe_routing._count_kernel, {"BLOCK": moe_routing.PAIRS_BLOCK}, 4, DEFAULT_STAGES)
    found["align: scan"] = (moe_routing._scan_kernel, align, 4, DEFAULT_STAGES)
    found["align: place"] = (moe_routing._place_kernel, {"BLOCK": moe_routing.PAIRS_BLOCK}, 4, DEFAULT_STAGES)
    return found


def expert_gemm_cases() -> dict[str, tuple]:
    """The Triton path's gate/up and down GEMMs at each of its configs, and the top-k sum."""
    found = {}
    for config in [config for _, config in moe_triton.CONFIGS] + [moe_triton.DIRECT_CONFIG]:
        direct = config.block_m == moe_triton.DIRECT
        block_m = moe_triton.MIN_BLOCK_M if direct else config.block_m
        for gated, tiles, k_in in ((True, config.up, HIDDEN), (False, config.down, WIDTH)):
            block_k = min(tiles.block_k, k_in)
            summed = direct and not gated
            constants = {
                "PAIRS_PER_ROW": TOP_K if gated else 1, "MUL_WEIGHT": not gated, "GATED": gated, "PRECISION": "tf32",
                "EVEN_K": k_in % block_k == 0, "DIRECT": direct, "TOP_K": TOP_K if summed else 0,
                "BLOCK_M": block_m, "BLOCK_N": tiles.block_n, "BLOCK_K": block_k, "PDL": direct,
            }
            # gate/up writes bf16 activations; down writes fp32 rows, one token's summed into bf16
            pointers = {"C": "*bf16", "Out": "*bf16", "Tickets": "*bf16"} if gated else {
                "C": "*fp32", "Out": "*bf16" if summed else "*fp32", "Tickets": "*i32" if summed else "*fp32"}
            # the GEMMs' sizes, multiples of 16 at every preset's shapes (attention's K is the key cache)
            pointers.update(K=MULTIPLE_OF_16, N=MULTIPLE_OF_16)
            name = f"experts {'gate/up' if gated else 'down'}, {'one token' if direct else f'{block_m}-row blocks'}"
            found[name] = (moe_triton._grouped_gemm_kernel, constants, tiles.num_warps, tiles.num_stages, pointers)
    found["top-k sum"] = (moe_triton._combine_kernel, {"TOP_K": TOP_K, "BLOCK": 1024}, 4, DEFAULT_STAGES)
    return found


def grouped_path_cases() -> dict[str, tuple]:
    """The grouped path from 512 tokens: the counting sort, the row gather, the gated
    activation, the sum, and the TMA grouped GEMM in its gathering, tail and down forms."""
    sort = {"CHUNK": 256, "E_POW2": EXPERTS}
    bf16_rows = {"Y": "*bf16", "GateUp": "*bf16", "Inverse": "*i32", "Order": "*i32", "Before": "*i32",
                 "Totals": "*i32", "Ends": "*i32"}
    found = {
        "sort: chunk counts": (moe_grouped._chunk_counts_kernel, sort, 4, DEFAULT_STAGES, bf16_rows),
        "sort: scan": (moe_grouped._chunk_scan_kernel, {"E_POW2": EXPERTS, "BLOCK": 1024}, 4, DEFAULT_STAGES,
                       bf16_rows),
        "sort: place": (moe_grouped._place_pairs_kernel, sort, 4, DEFAULT_STAGES, bf16_rows),
        "gather rows": (moe_grouped._gather_rows_kernel, {"TOP_K": TOP_K, "BLOCK": 1024}, 4, DEFAULT_STAGES,
                        bf16_rows),
        "silu, mul, weight": (moe_grouped._silu_mul_weight_kernel, {"BLOCK": 1024}, 4, DEFAULT_STAGES, bf16_rows),
        "sum sorted rows": (moe_grouped._sum_sorted_rows_kernel, {"TOP_K": TOP_K, "BLOCK": 1024}, 4, DEFAULT_STAGES,
                            bf16_rows),
    }
    gated, down = moe_tma_gemm._GATED_TILES, moe_tma_gemm._DOWN_TILES
    bm, bk = 128, 64
    for name, tiles, gather, tail, stages in (
        ("gate/up gathering, narrow tails (shipped under 64 rows)", {**gated, **moe_tma_gemm._NARROW_TAILS}, TOP_K, True,
         gated["num_stages"]),
        ("gate/up gathering, whole tiles (shipped)", gated, TOP_K, False, gated["num_stages"]),
        ("gate/up gathering, two products", {**gated, "joint_gate_up": False}, TOP_K, False, gated["num_stages"]),
        ("gate/up over sorted rows, tails", {**gated, "joint_gate_up": False}, 0, True, gated["num_stages"]),
        ("down", down, 0, False, 3),
    ):
        bn = tiles["block_n"]
        constants = {"GATED": name.startswith("gate"), "GATHER_TOP_K": gather, "E_POW2": EXPERTS, "BM": bm,
                     "BN": bn, "BK": bk, "FLATTEN": tiles["flatten"], "TAIL": tail, "NARROW": tail, "WS": False,
                     "ORDER": tiles.get("tile_order", 0), "JOINT": tiles.get("joint_gate_up", False)}
        types = {"b_desc": f"tensordesc<bf16[{bn},{bk}]>", "X": "*bf16", "Out": "*bf16", "Ends": "*i32",
                 "Weights": "*fp32", "Order": "*i32", "K": MULTIPLE_OF_16, "n_out": MULTIPLE_OF_16,
                 "b_rows_per_expert": MULTIPLE_OF_16}
        if tiles.get("joint_gate_up"):
            types["b_joint_desc"] = f"tensordesc<bf16[1,2,{bn},{bk}]>"
        else:
            constants["b_joint_desc"] = None
        if gather:
            constants["a_desc"] = constants["a_tail_desc"] = None
        else:
            types["a_desc"] = f"tensordesc<bf16[{bm},{bk}]>"
            if tail:
                types["a_tail_desc"] = f"tensordesc<bf16[{bm // 2},{bk}]>"
            else:
                constants["a_tail_desc"] = None
        found[f"tma grouped gemm, {name}"] = (moe_tma_gemm._grouped_gemm_tma_kernel, constants, tiles["num_warps"],
                                              stages, types)
    return found


# Kernels that must not spill registers to the stack: decode attention's, whose loop a spill
# slows (a stream-K trial of MLA decode's stage 1 spilled 120 bytes a thread and ran 20-30%
# slower, benchmarks/results/h100-h200-2026-11-27-mla-spares). The extend kernels spill under
# Triton 3.6 and 3.9 at the tiles their sweeps chose, so they are reported, not held.
NO_SPILL_PREFIXES = ("decode ", "mla decode ")


def main() -> int:
    for name, (kernel, constants, num_warps, num_stages, *pointers) in cases().items():
        try:
            compiled = compile_for(kernel, constants, {**POINTERS, **(pointers[0] if pointers else {})}, num_warps,
                                   num_stages)
            usage = resource_usage(compiled)
        except (CompilationError, RuntimeError) as err:  # the front end's, and ptxas's
            print(f"failed {name}: {type(err).__name__}: {err}")
            return 1
        print(f"compiled {name}: {usage['registers']} registers, {usage['stack_bytes']} stack bytes", flush=True)
        if usage["stack_bytes"] and name.startswith(NO_SPILL_PREFIXES):
            print(f"spilled {name}: {usage['stack_bytes']} bytes a thread")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
