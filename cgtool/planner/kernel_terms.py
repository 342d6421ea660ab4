"""Measured efficiency terms of cgtool's MoE and MLA kernels, for the roofline cost model.

A dense model's step is its weights streamed and its GEMMs' FLOPs at fixed fractions of the
datasheet peaks (cost.py), which r-series captures put within 4-8% of the H100. MoE and MLA
layers are not that: their experts' reads, their grouped GEMMs' FLOPs and the small kernels
around them (router GEMM, routing, alignment, top-k sum) were fitted here to issue 33's
measurements, each figure a replayed CUDA graph over six layers of distinct weights:

  H200, 2026-11-26, benchmarks/results/h200-2026-11-26-moe-mla/call3/moe-mla.json (MoE, fitted)
  and call8/moe-mla.json (the kernels of the last change: one token in three kernels, MLA's
  merge in the last program; benchmarks/bench_moe_mla.py --no-sweep, both presets' shapes).

MoE layer (least squares over 14 sizes, bs 1 to 8,192 tokens, both models, relative error
weighted; every size within 5.4% of its measurement): the experts reached plus each pair's
activations read at 0.93 of the datasheet bandwidth, the pairs' FLOPs at 0.54 of the bf16
peak, and 3.91 us for each kernel of the layer. The last is a kernel's floor in a replay
(launch and ramp), which a one-token step pays some twenty times a layer. One token takes
three kernels since call8 (router and routing, gate/up, down with the top-k sum); call8's
layers, all 14 sizes, are within 6.2% of these terms.

Past moe_grouped's threshold (an expert's mean rows at least 32: 512 tokens for both presets)
the experts run on the grouped path: a counting sort, cgtool's TMA grouped GEMMs (the gate/up one
reading each pair's token row and writing the activations), the top-k sum (2026-11-26,
benchmarks/bench_moe_grouped.py; H200 benchmarks/results/h200-2026-11-26-moe-tma/call13, H100
h100-2026-11-26-moe-tma/call7, each GPU with its own launch settings). Its layer is the same
weights read, each pair moving 6 bytes a hidden unit and 4 a unit of expert width (its token row
read, its activation written and read, its output written and summed), and the pairs' FLOPs at
0.72 of the bf16 peak, with no kernel floor. 0.72 is the figure whose largest error over the
24 grouped sizes (512-16k tokens, both models, both GPUs) is the least: H200 -13.4% to +9.2%,
H100 -10.3% to +13.3% (512 tokens, where the layer reads every expert, is the worst on both);
two more runs on other machines, not fitted (H200 call15, H100 call9), within 12.2%. Both GPUs
run these GEMMs at about the same rate while the H200 reads 1.4x faster, so a sum of read and
FLOPs leans one way on each GPU; the longer of the two instead was 24-50% off at 1k-2k tokens.

MLA decode on Hopper, the build as shipped (2026-11-27, benchmarks/bench_mla_floor.py;
gluon_mla's stage 1 at bs 1-16 and 256: h100-2026-11-27-gluon-mla/call18-h100 and
h200-h100-2026-11-27-gluon-mla/call2-h200; gluon_mla_wgmma's at bs 17-128:
h100-2026-11-27-mla-shipped and h200-h100-2026-11-27-mla-tail/call8-h200-final; checked again
after one-chunk requests were written at once and spare chunks launched last,
h100-h200-2026-11-27-mla-spares calls 5 and 6, where bs 96-128 x 1k ran 1-8% below it): the latent
rows read at 0.86 of the datasheet bandwidth, the kernel's floor, 4.4 us a layer where
gluon_mla_wgmma serves (the last program's ticket and merge, about 3.5 us in the programs'
clock stamps) and a second kernel's floor where the merge is a kernel of its own. From 32 real
requests within 10% on both GPUs, 8-24 requests within 17%, one request (6-12 us) within 26%;
triton_mla's terms had put these runs 5-47% too slow. Elsewhere triton_mla's stage 1
runs (call8: bs 1, 16, 32, 64 and 256 at 1k and 8k contexts): the same read, plus 0.6 us a
request up to 16 us a layer (the programs' start and the merge of chunks, each of some 256
programs in two waves carrying it once), plus the merge kernel's floor below 30 request rows;
bs 32 to 256 within 11%, bs 1 and 16 within 20%, on a Hopper GPU, the only one it was timed on.

MLA extend (2,048-8,192 new tokens, with a 6k prefix too): 0.20-0.23 of the bf16 peak,
counting 4 x (rank + rope) FLOPs a head and (query, key) pair as the cost model does (512
tokens: 0.10). The cost model takes 0.20, the low end: in `verify` on the Mooncake trace, whose
extend steps are mostly over long cached prefixes, deepseek-v2-lite's pairs ran at 1.11-1.13x
the price at 0.22 (the pair price `plan --profile verify.json` learns, six runs over both GPUs),
and its extend steps came out 10% slower than predicted at 0.22, 1% at 0.20.

Dense (GQA) extend attention (H200, 2026-11-26,
benchmarks/results/h200-2026-11-26-decode-chunks/sweep.json from
benchmarks/bench_kernel_sweep.py; 32/8 heads, head_dim 128, the kernel's default tiles): 320-333
TFLOP/s, 0.32-0.34 of the bf16 peak, from 8,192 new tokens alone to 2,048 after a 64k cached
prefix (2,048 alone: 0.28), counting 4 x head_dim FLOPs a head and pair. A cached prefix costs
no more a pair than the new tokens do. (The unmeasured 0.5 used before priced the pairs of the
Mooncake slice's long prefixes 1.5 times too cheap: docs/replay.md.)
"""

from __future__ import annotations

import numpy as np

from cgtool.specs.config import ModelConfig
from cgtool.specs.config_parts import expected_experts
from cgtool.specs.gpus import GpuSpec
from cgtool.units import BF16_BYTES

MOE_READ_EFFICIENCY = 0.93
MOE_FLOPS_EFFICIENCY = 0.54
KERNEL_FLOOR_MS = 3.91e-3  # one kernel of a replayed graph, at the least
# The same for the kernels outside the MoE layers (norms, rope, projections, attention): fitted
# to call8's whole bs-1 steps, which 3.91 us each over-predicted by 15% (qwen3-30b-a3b 3.88
# against 3.37 ms, deepseek-v2-lite 3.51 against 3.05); their elementwise kernels are smaller.
OTHER_KERNEL_FLOOR_MS = 2.8e-3
# Bytes a (token, expert) pair moves besides the weights: its token's row read by the gate/up
# GEMM (bf16) and its fp32 partial output written by the down GEMM and read by the top-k sum.
MOE_PAIR_BYTES_PER_HIDDEN = BF16_BYTES + 2 * 4
# Router logits, routing, alignment, gate/up GEMM, down GEMM, top-k sum; past
# ONE_PROGRAM_PAIRS the alignment takes four kernels, not one; one token takes three
# (cgtool.model.moe_triton.DIRECT_TOKENS: no alignment, routing and the sum fused).
MOE_KERNELS_ONE_TOKEN, MOE_KERNELS_SMALL, MOE_KERNELS_LARGE = 3, 6, 9
MOE_ONE_TOKEN_PATH = 1  # cgtool.model.moe_triton.DIRECT_TOKENS
MOE_ONE_PROGRAM_PAIRS = 4096  # cgtool.model.moe_routing.ONE_PROGRAM_PAIRS

# The grouped-GEMM path (cgtool.model.moe_grouped.GROUPED_MIN_MEAN_ROWS and its layer).
MOE_GROUPED_MIN_MEAN_ROWS = 32
MOE_GROUPED_FLOPS_EFFICIENCY = 0.72
MOE_GROUPED_PAIR_BYTES_PER_HIDDEN, MOE_GROUPED_PAIR_BYTES_PER_WIDTH = 6, 4

MLA_DECODE_READ_EFFICIENCY = 0.86
# Below this many (request, 16-head block) programs' rows the chunks are merged by a kernel of
# their own (cgtool.attention.triton_mla: more than FUSED_MERGE_SPLITS chunks a request, which
# up to 29 rows get since the chunks are rounded down to fit 264 programs).
MLA_FUSED_MERGE_ROWS = 30
MLA_HEADS_PER_PROGRAM = 16  # cgtool.attention.triton_mla.BLOCK_H
# On Hopper, a one-head-block batch of this many requests runs gluon_mla_wgmma's stage 1 in
# fewer chunks, merged in the last program (cgtool.attention.triton_mla.WGMMA_MIN_BS and
# WGMMA_PROGRAMS); that tail costs MLA_WGMMA_TAIL_MS a layer.
MLA_WGMMA_MIN_BS, MLA_WGMMA_MAX_BS = 17, 132
MLA_WGMMA_TAIL_MS = 4.4e-3
# Up to this many requests the merge runs in the value projection's kernel instead
# (cgtool.attention.mla_merge_projection.MAX_BS), which saves the ticket and the last program's
# merge. Charging the attention with that kernel less the product's own time, its tail is 1.4
# us a layer shorter: 0.4-2.0 us at bs 17-64 x 1k, 1.36 on average over both GPUs (H200 call
# 2, H100 call 4 of benchmarks/results/h200-h100-2026-11-27-mla-projection). The rest of what a
# layer saves, 0.3-1.3 us more (the product's own launch), is left unpriced: the step is
# predicted that much long. Since 2026-11-27 a program whose requests hold more than four chunks
# merges over its partial slots, its requests spread over four programs a head's column block,
# and stage 1 reads its first slots before its wait: 0.3 us a layer shorter on average over bs
# 5-64 x 1k-8k on both GPUs (-2.0 to +0.6 us; H200 calls 4-5, H100 call 7 of
# benchmarks/results/h200-h100-2026-11-27-mla-merge-slots).
MLA_PROJECTION_MERGE_MAX_BS = 66
MLA_PROJECTION_MERGE_TAIL_MS = MLA_WGMMA_TAIL_MS - 1.7e-3
# And from this many (cgtool.attention.mla_merge_projection.MIN_BS): below MLA_WGMMA_MIN_BS the
# same stage 1 and merge replace gluon_mla's stage 1 and its merge kernel (from one request since
# 2026-11-28, from 5 before).
MLA_PROJECTION_MERGE_MIN_BS = 1
# triton_mla's stage 1 (where Gluon does not run): a fixed part a layer of 0.6 us a request up
# to 16 us, fitted to the H200 call8 run.
MLA_TRITON_REQUEST_MS = 0.6e-3
MLA_TRITON_FIXED_MS = 16e-3
MLA_EXTEND_FLOPS_EFFICIENCY = 0.20
# Copies an MLA layer launches in extend from two rows on, of views that are contiguous at one
# row: the latent's slice before its norm and the value output's transpose. A census of
# deepseek-v2-lite's captured decode forwards counted them, 54 `elementwise_kernel`s from bs 2,
# 2.1-2.9 us each (H200, 2026-11-27, benchmarks/results/h200-h100-2026-11-27-mla-flat/
# call1-h200-census); eager code (decode's graphs) no longer launches them (cgtool.model.mla),
# the census of benchmarks/results/h200-h100-2026-11-27-mla-projection finds none. Extend's
# compiled pieces keep the product's transpose, and the slice goes to the norm as a custom op's
# argument: neither was counted there, so extend keeps both priced, at OTHER_KERNEL_FLOOR_MS.
MLA_EXTEND_COPIES_FROM_TWO_ROWS = 2
GQA_EXTEND_FLOPS_EFFICIENCY = 0.33


def moe_layers_ms(cfg: ModelConfig, gpu: GpuSpec, rows: np.ndarray) -> np.ndarray:
    """All MoE layers of one forward over each of `rows` tokens: experts and routing."""
    moe = cfg.moe
    if moe is None:
        return np.zeros_like(rows, dtype=np.float64)
    rows = np.asarray(rows, dtype=np.float64)
    pairs = rows * moe.top_k
    width = moe.expert_intermediate_size
    weights = expected_experts(moe.num_experts, moe.top_k, rows) * cfg.expert_params * BF16_BYTES
    flops_ms = 2.0 * pairs * cfg.expert_params / gpu.bf16_flops * 1e3
    ms_per_byte = 1e3 / (gpu.bandwidth_bytes_s * MOE_READ_EFFICIENCY)
    kernels = np.where(pairs <= MOE_ONE_PROGRAM_PAIRS, MOE_KERNELS_SMALL, MOE_KERNELS_LARGE)
    kernels = np.where(rows <= MOE_ONE_TOKEN_PATH, MOE_KERNELS_ONE_TOKEN, kernels)
    triton_ms = (
        (weights + pairs * cfg.hidden_size * MOE_PAIR_BYTES_PER_HIDDEN) * ms_per_byte
        + flops_ms / MOE_FLOPS_EFFICIENCY
        + kernels * KERNEL_FLOOR_MS
    )
    pair_bytes = cfg.hidden_size * MOE_GROUPED_PAIR_BYTES_PER_HIDDEN + width * MOE_GROUPED_PAIR_BYTES_PER_WIDTH
    grouped_ms = (weights + pairs * pair_bytes) * ms_per_byte + flops_ms / MOE_GROUPED_FLOPS_EFFICIENCY
    grouped = pairs >= MOE_GROUPED_MIN_MEAN_ROWS * moe.num_experts
    per_layer_ms = np.where(grouped, grouped_ms, triton_ms)
    return np.where(rows > 0, cfg.num_moe_layers * per_layer_ms, 0.0)


def kernel_floor_ms(cfg: ModelConfig, kernels: int) -> float:
    """The floor of the kernels outside the MoE layers' own, for MoE and MLA models. Dense
    models keep the plain roofline, which their captures already match."""
    if cfg.moe is None and cfg.mla is None:
        return 0.0
    return kernels * OTHER_KERNEL_FLOOR_MS


def mla_extend_copies_ms(num_layers: int, tokens: np.ndarray) -> np.ndarray:
    """MLA_EXTEND_COPIES_FROM_TWO_ROWS copies a layer wherever an extend holds two tokens or more."""
    tokens = np.asarray(tokens, dtype=np.float64)
    return np.where(tokens >= 2, num_layers * MLA_EXTEND_COPIES_FROM_TWO_ROWS * OTHER_KERNEL_FLOOR_MS, 0.0)


def _mla_hopper_paths(num_heads: int, bs: np.ndarray, hopper: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(request rows, the value projection merges, the warpgroup-MMA stage 1 serves) for each
    batch size: the choices cgtool.attention makes for MLA decode."""
    rows = bs * -(-num_heads // MLA_HEADS_PER_PROGRAM)
    one_block = hopper & (rows == bs)
    projected = one_block & (bs >= MLA_PROJECTION_MERGE_MIN_BS) & (bs <= MLA_PROJECTION_MERGE_MAX_BS)
    wgmma = projected | (one_block & (bs >= MLA_WGMMA_MIN_BS) & (bs <= MLA_WGMMA_MAX_BS))
    return rows, projected, wgmma


def mla_decode_fixed_ms(num_layers: int, num_heads: int, bs: np.ndarray, hopper: bool) -> np.ndarray:
    """MLA decode attention's cost beyond its latent read, all layers, for each batch size:
    on Hopper the warpgroup-MMA stage 1's merge where it serves (in its last program, or in the
    value projection from MLA_PROJECTION_MERGE_MIN_BS to MLA_PROJECTION_MERGE_MAX_BS requests);
    elsewhere triton_mla's fixed part; and the merge kernel's floor where the merge is a kernel
    apart. The step's plan, once a forward, is `mla_flat_plan_ms`."""
    bs = np.asarray(bs, dtype=np.float64)
    rows, projected, wgmma = _mla_hopper_paths(num_heads, bs, hopper)
    if hopper:
        per_layer = np.where(projected, MLA_PROJECTION_MERGE_TAIL_MS, np.where(wgmma, MLA_WGMMA_TAIL_MS, 0.0))
    else:
        per_layer = np.minimum(bs * MLA_TRITON_REQUEST_MS, MLA_TRITON_FIXED_MS)
    separate = (rows < MLA_FUSED_MERGE_ROWS) & ~wgmma
    per_layer = per_layer + np.where(separate, KERNEL_FLOOR_MS, 0.0)
    return np.where(bs > 0, num_layers * per_layer, 0.0)


def mla_flat_plan_ms(num_heads: int, bs: np.ndarray, hopper: bool) -> np.ndarray:
    """The step's flat plan (cgtool.attention.mla_flat_plan), one kernel a forward wherever the
    warpgroup-MMA stage 1 serves, priced at a kernel's floor: a kernel census of
    deepseek-v2-lite's captured decode found one a forward from bs 8 (call 14 of
    benchmarks/results/h200-h100-2026-11-27-mla-flat-plan)."""
    bs = np.asarray(bs, dtype=np.float64)
    _, _, wgmma = _mla_hopper_paths(num_heads, bs, hopper)
    return np.where(wgmma & (bs > 0), KERNEL_FLOOR_MS, 0.0)
