"""A ViT capture session: the vision tower alone on the GPU, one graph per image grid,
each verified against eager and timed, with the same rows and totals as the other kinds.

The language model is not loaded: ViT graphs are separate subgraphs that coexist with the
LM's graphs in SGLang (seed 001), and their cost is theirs alone. `--kind vit` names a vision
preset with --model (cgtool/presets/vision/).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from functools import partial
from typing import Any

import torch

from cgtool.capture import per_size
from cgtool.capture.measure import check_replay
from cgtool.capture.memory import read_memory
from cgtool.capture.options import CaptureOptions, CaptureProgress, ProgressCallback, SessionState
from cgtool.capture.session import (
    build_report,
    note_startup,
    require_cuda,
    totals_after_capture,
    zero_totals,
)
from cgtool.capture.timing import copy_bandwidth_bytes_s
from cgtool.documents.results import CaptureReport, ModelInfo
from cgtool.model.vit import Segments, VisionLayout, VisionTower, build_vision_tower
from cgtool.runners.vit import VitGraphRunner
from cgtool.specs.vision import VisionPreset, capture_grids, load_vision_preset

ARCHITECTURE = "Qwen2_5_VisionTransformer"  # HF's class of this tower


def run_vit_capture(
    opts: CaptureOptions, on_progress: ProgressCallback, state: SessionState
) -> CaptureReport:
    """Build the tower with random weights, capture every grid of `opts.image_sizes` (most
    patches first, one shared pool), then verify and time each; `state` keeps what was
    gathered if this stops early."""
    from cgtool.runners.pool import get_global_graph_memory_pool

    note_startup(state)
    require_cuda()
    preset = load_vision_preset(opts.model)
    grids = capture_grids(list(opts.image_sizes), preset)
    on_progress(CaptureProgress("", "load", None, 0, 1, torch.cuda.mem_get_info()[0]))
    with state.phase("load"):
        tower = build_vision_tower(preset, device="cuda", dtype=opts.dtype, seed=opts.seed)
        bandwidth = copy_bandwidth_bytes_s()
    weights_bytes = _weights_bytes(tower)
    state.model = vision_model_info(preset, opts.dtype, weights_bytes)
    pool = get_global_graph_memory_pool()
    torch.cuda.empty_cache()
    before = read_memory(pool)
    state.totals = dataclasses.replace(
        zero_totals(), weights_bytes=weights_bytes, free_before_capture_bytes=before.free_bytes,
        free_after_capture_bytes=before.free_bytes, copy_bandwidth_bytes_s=bandwidth,
    )
    capture_vit(tower, grids, opts, pool, bandwidth, on_progress, state)
    return build_report(opts, None, state, totals_after_capture(pool, before, state))


def vision_model_info(preset: VisionPreset, dtype: torch.dtype, weights_bytes: int) -> ModelInfo:
    blob = json.dumps(dataclasses.asdict(preset) | {"name": ""}, sort_keys=True).encode()
    return ModelInfo(
        name=preset.name,
        architecture=ARCHITECTURE,
        config_hash=hashlib.sha256(blob).hexdigest()[:16],
        dtype=str(dtype).removeprefix("torch."),
        param_bytes=weights_bytes,
        num_layers=preset.depth,
    )


def capture_vit(
    tower: VisionTower, grids: list[tuple[int, int]], opts: CaptureOptions, pool: Any,
    bandwidth: float, on_progress: ProgressCallback, state: SessionState,
) -> None:
    """Capture, then compare each grid's replay with the eager tower on the same random
    pixels (the merged tokens, in raster order) and time both."""
    runner = VitGraphRunner(tower, grids, opts.enable_cudagraph_gc)
    state.runners.append(runner)  # graphs must outlive the session: they share one pool
    with state.phase("capture"), per_size.sglang_mem_usage(state, "vit"):
        costs = per_size.capture_each_size("vit", runner, runner.capture_patches, pool, on_progress, state, opts)
    calls: list[per_size.MeasuredCall] = []
    with per_size.timed_sizes(state, "vit") as pools:
        for i, (patches, cost) in enumerate(costs.items()):
            per_size.report_progress(on_progress, "vit", "measure", patches, i, len(costs))
            layout = runner.layouts[patches]
            grid = layout.grids[0]
            gen = torch.Generator(device="cuda").manual_seed(opts.seed + patches)
            pixels = torch.randn(  # [patches, patch_dim], as the processor normalises them
                (patches, tower.patch_dim), generator=gen, device="cuda", dtype=opts.dtype
            )
            eager = partial(lambda p, g: [runner.eager(p, g)], pixels, grid)
            replay = partial(lambda p, g: [runner.replay(p, g)], pixels, grid)
            check = per_size.measured(state, "vit", patches, partial(
                check_replay, eager=eager, replay=replay, dtype=opts.dtype, pools=pools,
            ))
            if check is None:
                continue
            per_size.record_size(state, "vit", patches, cost, check, _roofline_ms(tower, layout, bandwidth))
            calls.append((patches, replay, eager))
    per_size.count_kernels(state, "vit", calls, opts, on_progress, runner.graph_kernels)
    per_size.run_kernel_counts(state)


def _weights_bytes(tower: VisionTower) -> int:
    return sum(p.numel() * p.element_size() for p in tower.parameters())


def _roofline_ms(tower: VisionTower, layout: VisionLayout, bandwidth: float) -> float:
    """The larger of reading the weights once and the FLOPs at the GPU's peak: every GEMM's
    2 x params x rows, plus attention's 4 x hidden per (query, key) pair inside a segment."""
    preset, n = tower.preset, layout.num_patches
    unit = preset.spatial_merge_size**2
    merger = sum(p.numel() for p in tower.merger.parameters())
    dense = sum(p.numel() for p in tower.parameters()) - merger
    flops = 2 * dense * n + 2 * merger * (n // unit)
    full = set(preset.fullatt_block_indexes)
    for i in range(preset.depth):
        pairs = _attention_pairs(layout.full if i in full else layout.windows, n)
        flops += 4 * preset.hidden_size * pairs
    bytes_ms = _weights_bytes(tower) / bandwidth * 1e3
    peak = per_size.peak_flops()
    return max(bytes_ms, flops / peak * 1e3) if peak else bytes_ms


def _attention_pairs(segments: Segments, tokens: int) -> int:
    """(query, key) pairs attended: the sum of squared segment lengths."""
    if segments.gather is None:
        return tokens * tokens
    if segments.key_mask is None:
        return tokens * segments.gather.shape[1]
    lengths = segments.key_mask.flatten(1).sum(dim=1)
    return int((lengths * lengths).sum())
