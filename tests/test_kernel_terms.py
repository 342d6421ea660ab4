"""The MoE and MLA terms of the cost model against the H200 measurements they were fitted to,
and the roofline built on them against whole captured steps (committed raw files, issue 33)."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

from cgtool.planner.cost import roofline_cost
from cgtool.planner.kernel_terms import MOE_GROUPED_MIN_MEAN_ROWS, kernel_floor_ms, moe_layers_ms
from cgtool.specs.config import load_model_config
from cgtool.specs.gpus import gpu_spec

RESULTS = Path(__file__).parent.parent / "benchmarks/results"
# Fitted on the H200 (call3, the final kernels); the H100 run checks that the same fractions carry over to the
# other GPU class by its datasheet figures alone. qwen3-30b-a3b did not fit a 256 x 1k KV
# pool on the H100 at 0.85, so only its layers were measured there.
H200_RUN = (RESULTS / "h200-2026-11-26-moe-mla/call3", "H200", "H200")
# The kernels of the last change (one token in three kernels, MLA's merge in the last program).
H200_NOW = (RESULTS / "h200-2026-11-26-moe-mla/call8", "H200", "H200")
H100_RUN = (RESULTS / "h100-2026-11-26-moe-mla", "H100-80GB", "H100")
# Today's kernels on the H100, nothing fitted there: the bench, and captures at a 1k context
# (qwen3-30b-a3b to bs 64, its 256 x 1k KV pool does not fit at 0.85).
H100_NOW = (RESULTS / "h100-2026-11-26-moe-mla-2/kernels", "H100-80GB", "H100")
# Extend sizes on both paths (the grouped path past its threshold: cgtool's TMA GEMMs, each GPU
# with its launch settings); its term is fitted to the first H200 and H100 runs at once, the
# others (other machines, same code) check it. The H200's call 13 and the H100's call 8 hold
# captures of both kinds (qwen3-30b-a3b to bs 64 on the H100: its 256 x 1k KV pool does not fit
# at 0.85; call 8 ran before the threshold fell to 32 mean rows, its 512-token steps on the
# Triton path).
H200_GROUPED = (RESULTS / "h200-2026-11-26-moe-tma/call13", "H200", "H200")
H200_GROUPED_AGAIN = (RESULTS / "h200-2026-11-26-moe-tma/call15", "H200", "H200")
H100_GROUPED = (RESULTS / "h100-2026-11-26-moe-tma/call7", "H100-80GB", "H100")
H100_GROUPED_AGAIN = (RESULTS / "h100-2026-11-26-moe-tma/call9", "H100-80GB", "H100")
H200_GROUPED_CAPTURES = H200_GROUPED
H100_GROUPED_CAPTURES = (RESULTS / "h100-2026-11-26-moe-tma/call8", "H100-80GB", "H100")
# The afternoon's code as shipped on the H100 (the grouped path from 32 mean rows, so its
# 512-token steps too; dependent launches at one token): decode bs 1/8/64, piecewise 512 and 4k.
H100_SHIPPED_CAPTURES = (RESULTS / "h100-2026-11-26-pdl-tails/call8", "H100-80GB", "H100")
MODELS = ["qwen3-30b-a3b", "deepseek-v2-lite"]


def _grouped(cfg, tokens: int) -> bool:
    moe = cfg.moe
    return tokens * moe.top_k >= MOE_GROUPED_MIN_MEAN_ROWS * moe.num_experts


def _load(run: Path, name: str) -> dict:
    """A result file, or its copy packed as NAME.xz (scripts/compact_results.py --pack)."""
    packed = run / f"{name}.xz"
    return json.loads(lzma.decompress(packed.read_bytes()) if packed.exists() else (run / name).read_text())


def _capture_report(folder: Path, model: str) -> dict:
    """A capture's report as the `moe` stage leaves it (runs/) or as copied beside a bench."""
    staged = folder / "runs" / f"moe-{model}" / "report.json"
    return _load(staged.parent, staged.name) if staged.exists() else _load(folder, f"capture-{model}.json")


def _moe_rows(run: tuple, name: str, model: str, sizes: list[int]) -> list[dict]:
    """One model's MoE rows of a bench file, after checking its GPU and sizes."""
    folder, _, nvml = run
    bench = _load(folder, name)
    assert nvml in bench["device"]
    rows = bench["moe"][model]
    assert [r["tokens"] for r in rows] == sizes
    return rows


def _layer_error(measured_us: float, cfg, gpu: str, tokens: int) -> float:
    """The docs' error of one MoE layer: measured / predicted - 1."""
    predicted_us = moe_layers_ms(cfg, gpu_spec(gpu), tokens) / cfg.num_moe_layers * 1e3
    return measured_us / predicted_us - 1


@pytest.mark.parametrize("run", [H200_RUN, H200_NOW, H100_RUN, H100_NOW],
                         ids=["H200-fit", "H200-now", "H100-then", "H100-now"])
@pytest.mark.parametrize("model", MODELS)
def test_moe_layer_terms_predict_every_measured_layer_within_10_percent(model, run):
    gpu, cfg = run[1], load_model_config(model)
    rows = _moe_rows(run, "moe-mla.json", model, [1, 8, 64, 256, 512, 2048, 8192])
    if run in (H200_RUN, H100_RUN):  # one token ran six kernels there, not today's three
        rows = rows[1:]
    # These runs predate the grouped GEMM: its sizes ran the Triton path, which the terms no
    # longer describe there (the next test checks them).
    rows = [row for row in rows if not _grouped(cfg, row["tokens"])]
    assert len(rows) >= 3
    for row in rows:
        assert abs(_layer_error(row["layer_us"], cfg, gpu, row["tokens"])) <= 0.10, row["tokens"]


@pytest.mark.parametrize("run", [H200_GROUPED, H200_GROUPED_AGAIN, H100_GROUPED, H100_GROUPED_AGAIN],
                         ids=["H200", "H200-again", "H100", "H100-again"])
@pytest.mark.parametrize("model", MODELS)
def test_moe_layer_terms_predict_both_paths_at_extend_sizes(model, run):
    gpu, cfg = run[1], load_model_config(model)
    rows = _moe_rows(run, "moe-grouped.json", model, [256, 512, 1024, 2048, 4096, 8192, 16384])
    paths = []
    for row in rows:
        path = "grouped" if _grouped(cfg, row["tokens"]) else "triton"
        paths.append(path)
        # one flop efficiency for both GPU classes: the grouped layers within 13.3% (512 tokens,
        # where the layer reads every expert), the Triton layers within 10%
        bound = 0.135 if path == "grouped" else 0.10
        assert abs(_layer_error(row[f"{path}_layer_us"], cfg, gpu, row["tokens"])) <= bound, (row["tokens"], path)
        assert row["grouped_replay_equals_eager"]
    assert paths.count("grouped") >= 5 and paths.count("triton") >= 1


@pytest.mark.parametrize("run", [H200_NOW, H100_NOW], ids=["H200", "H100"])
def test_triton_mla_decode_terms_predict_the_run_they_were_fitted_to(run):
    # Where Gluon does not run, triton_mla's stage 1 serves: its terms (the latent read, the
    # fixed part and the merge's own kernel at small batches, plus the one attention kernel's
    # floor that the forward's count holds) against the Hopper runs of that kernel.
    from cgtool.planner.kernel_terms import (
        KERNEL_FLOOR_MS,
        MLA_DECODE_READ_EFFICIENCY,
        mla_decode_fixed_ms,
    )

    folder, gpu_name, nvml = run
    bench = _load(folder, "moe-mla.json")
    assert nvml in bench["device"]
    gpu = gpu_spec(gpu_name)
    cases = {(r["bs"], r["context"]): r["us"] for r in bench["mla"]["decode"]}
    assert set(cases) == {(bs, ctx) for bs in (1, 16, 32, 64, 256) for ctx in (1024, 8192)}
    for (bs, ctx), measured_us in cases.items():
        read_ms = bs * ctx * 576 * 2 / (gpu.bandwidth_bytes_s * MLA_DECODE_READ_EFFICIENCY) * 1e3
        predicted_us = (read_ms + KERNEL_FLOOR_MS + mla_decode_fixed_ms(1, 16, [bs], hopper=False)[0]) * 1e3
        assert predicted_us == pytest.approx(measured_us, rel=0.12 if bs >= 32 else 0.25), (bs, ctx)


# MLA decode as shipped on Hopper, us a layer from replayed graphs of six layers
# (benchmarks/bench_mla_floor.py): gluon_mla's stage 1 at bs 1-16 and 256 (the runs that timed
# it at every batch), gluon_mla_wgmma's at bs 17-132 (one-chunk requests written at once, spare
# chunks launched last; its programs then a grid, since mapped flat, which at these equal lengths
# gives the same chunks and ran within 0.7 us a layer of it: benchmarks/results/
# h200-h100-2026-11-27-mla-flat, calls 5 and 6).
SHIPPED_MLA = {
    "H100": ("H100-80GB", "h100-2026-11-27-gluon-mla/call18-h100", "h100-h200-2026-11-27-mla-spares/call5-h100-floor"),
    "H200": ("H200", "h200-h100-2026-11-27-gluon-mla/call2-h200",
             "h100-h200-2026-11-27-mla-spares/call6-h200-floor-verify"),
}


def _mla_floor_cases(folder: str, keep) -> tuple[str, float, list[dict]]:
    with lzma.open(RESULTS / folder / "mla-floor.json.xz") as packed:
        bench = json.loads(packed.read())
    return bench["device"], bench["copy_bytes_s"], [c for c in bench["cases"] if keep(c["bs"])]


@pytest.mark.parametrize("gpu_class", sorted(SHIPPED_MLA))
def test_mla_decode_terms_predict_the_shipped_kernels_at_every_batch_and_context(gpu_class):
    # The latent rows read at MLA_DECODE_READ_EFFICIENCY of the datasheet, the attention
    # kernel's floor, the warpgroup-MMA stage 1's tail where it serves and the merge kernel's
    # floor where the merge runs apart: the old triton_mla terms had put these runs 5-47% too
    # slow. From 32 real requests within 10%; one request (a 6-12 us kernel) within 26%; the
    # rest (8-24 requests, a padded 33 of 20) within 17%.
    from cgtool.planner.kernel_terms import (
        KERNEL_FLOOR_MS,
        MLA_DECODE_READ_EFFICIENCY,
        mla_decode_fixed_ms,
    )

    gpu_name, gluon_run, wgmma_run = SHIPPED_MLA[gpu_class]
    gpu = gpu_spec(gpu_name)
    checked = set()
    # bs 1-66 merge in the value projection: test_mla_decode_terms_predict_the_projection_path
    # (these runs timed mla_decode_attention, whose stage 1 at bs 1-16 a model's step no longer
    # runs; its bs 1-4 were checked here until the projection's path took them, 2026-11-28).
    for folder, keep in ((gluon_run, lambda bs: bs > 132), (wgmma_run, lambda bs: 67 <= bs <= 132)):
        device, copy_bytes_s, cases = _mla_floor_cases(folder, keep)
        assert gpu_class in device
        for case in cases:
            bs, ctx = case["bs"], case["context"]
            read_bytes = case["bound_us"] * 1e-6 * copy_bytes_s  # the real requests' latent rows
            read_ms = read_bytes / (gpu.bandwidth_bytes_s * MLA_DECODE_READ_EFFICIENCY) * 1e3
            predicted_us = (read_ms + KERNEL_FLOOR_MS + mla_decode_fixed_ms(1, 16, [bs], gpu.hopper)[0]) * 1e3
            real = case.get("real", bs)  # a padded batch: its graph's size, fewer requests
            bound = 0.10 if real >= 32 else 0.17
            assert abs(case["mla_us"] / predicted_us - 1) <= bound, (bs, ctx)
            checked.add(bs)
    assert {128, 256} <= checked


# The merge in the value projection, as shipped (the step's flat plan, the projection released at
# stage 1's start, its merge over slots past four chunks), us a layer from graphs of 27 layers,
# each storing its newest rows first (benchmarks/probe_mla_projection.py --with-store): from 5
# requests (2026-11-27), and at 1-4 requests (2026-11-28, --min-bs 1, with the Gluon projection
# and the capped plan), which the path serves since.
SMALL_BATCHES = "h200-h100-2026-11-28-mla-small-batches"
PROJECTION_PATH = {
    "H100": ("H100-80GB", ["h200-h100-2026-11-27-mla-merge-slots/call7-h100/probe.json.xz",
                           f"{SMALL_BATCHES}/call5-h100/probe.json.xz"]),
    "H200": ("H200", ["h200-h100-2026-11-27-mla-merge-slots/call5-h200/probe.json.xz",
                      f"{SMALL_BATCHES}/call3-h200/probe.json.xz"]),
}


@pytest.mark.parametrize("gpu_class", sorted(PROJECTION_PATH))
def test_mla_decode_terms_predict_the_projection_path(gpu_class):
    # The layer less the product's and the store's own time against the latent read, the
    # attention kernel's floor and MLA_PROJECTION_MERGE_TAIL_MS: within 17% under 32 requests
    # and 10% from 32, as above (bs 5-64 x 1k-8k: H200 -9.2% to +5.1%, H100 -10.9% to -2.0%).
    # At 1-4 requests the terms price up to 27% too much (H200 +5.6% at bs 1 x 8k, whose plan
    # takes 32 programs, to -22.5%; H100 -8.2% to -27.1%): such a layer costs 3-5 us past its
    # read where the floor and the tail make 6.6. Held to 28% there.
    # The terms price a step whose requests share one context, as verify replays them; the
    # probe's mixed batch (one long request among short ones) is left out.
    from cgtool.planner.kernel_terms import (
        KERNEL_FLOOR_MS,
        MLA_DECODE_READ_EFFICIENCY,
        mla_decode_fixed_ms,
    )

    gpu_name, paths = PROJECTION_PATH[gpu_class]
    gpu = gpu_spec(gpu_name)
    checked = set()
    for path in paths:
        bench = json.loads(lzma.decompress((RESULTS / path).read_bytes()))
        assert gpu_class in bench["device"] and bench["layers"] == 27
        for case in bench["cases"]:
            bs = case["bs"]
            if case["lens"]:
                continue
            read_bytes = case["bound_us"] * 1e-6 * bench["copy_bytes_s"]
            read_ms = read_bytes / (gpu.bandwidth_bytes_s * MLA_DECODE_READ_EFFICIENCY) * 1e3
            predicted_us = (read_ms + KERNEL_FLOOR_MS + mla_decode_fixed_ms(1, 16, [bs], gpu.hopper)[0]) * 1e3
            measured_us = case["us"]["fused"] - case["us"]["product"] - case["us"]["store"]
            bound = 0.10 if bs >= 32 else 0.28 if bs < 5 else 0.17
            assert abs(measured_us / predicted_us - 1) <= bound, (bs, case["context"])
            checked.add(bs)
    # The shapes the earlier test held against the projection's first form (six-layer graphs,
    # 2026-11-27, h200-h100-2026-11-27-mla-projection), now against the kernels as shipped,
    # and one to four requests.
    assert {1, 2, 3, 4, 5, 8, 12, 16, 17, 24, 32, 40, 48, 64} <= checked


@pytest.mark.parametrize("run", [H200_NOW, H100_NOW, H100_GROUPED_CAPTURES, H200_GROUPED_CAPTURES,
                                 H100_SHIPPED_CAPTURES], ids=["H200", "H100", "H100-grouped", "H200-grouped",
                                                              "H100-shipped"])
@pytest.mark.parametrize("model", MODELS)
def test_roofline_predicts_captured_moe_and_mla_steps_within_15_percent(model, run):
    # Captures at a 1k context: decode and piecewise extend on both GPUs with the grouped path,
    # and on the H200 before it; decode only on the H100 before it.
    folder, gpu, nvml = run
    report = _capture_report(folder, model)
    assert nvml in report["environment"]["gpu_name"]
    cfg = load_model_config(model)
    context = report["settings"]["context_len"]
    cost = roofline_cost(cfg, gpu_spec(gpu), max_bs=256, max_tokens=8192)
    checked = 0
    for size in report["sizes"]:
        n = size["size"]
        if size["kind"] == "decode":
            predicted = cost.decode_graph_ms[n] + cost.kv_read_ms_per_token * n * (context + 1)
        elif run is H200_NOW and _grouped(cfg, n):
            continue  # captured on the Triton path, before the grouped GEMM took these sizes
        else:
            predicted = cost.extend_graph_ms[n] + cost.attention_ms_per_pair * n * (n + 1) / 2
        assert predicted == pytest.approx(size["replay_ms"], rel=0.15), (size["kind"], n)
        checked += 1
    assert checked >= 3
    assert run is H200_NOW or checked == len(report["sizes"])


def test_dense_models_keep_the_plain_roofline():
    llama = load_model_config("llama-3.1-8b")
    assert kernel_floor_ms(llama, 356) == 0.0
    assert (moe_layers_ms(llama, gpu_spec("H200"), [1, 64]) == 0).all()
    assert kernel_floor_ms(load_model_config("deepseek-v2-lite"), 100) > 0


def test_the_planners_copy_of_the_one_token_moe_path_matches_the_kernels():
    pytest.importorskip("triton")
    from cgtool.model.moe_routing import ROUTER_ROUTE_TOKENS
    from cgtool.model.moe_triton import DIRECT_TOKENS
    from cgtool.planner.kernel_terms import MOE_ONE_TOKEN_PATH

    assert MOE_ONE_TOKEN_PATH == DIRECT_TOKENS == ROUTER_ROUTE_TOKENS


def test_the_planners_copy_of_the_mla_merge_rule_matches_the_kernels():
    # The planner does not import Triton: kernel_terms repeats triton_mla's block of heads, the
    # batches gluon_mla_wgmma's stage 1 serves on Hopper (its tail instead of a merge kernel,
    # shorter where the value projection merges), and the batches whose merge is a kernel of its
    # own (more than FUSED_MERGE_SPLITS chunks).
    pytest.importorskip("triton")
    import numpy as np

    from cgtool.attention import gluon_mla_wgmma, mla_merge_projection, triton_mla
    from cgtool.planner.kernel_terms import (
        KERNEL_FLOOR_MS,
        MLA_HEADS_PER_PROGRAM,
        MLA_PROJECTION_MERGE_MAX_BS,
        MLA_PROJECTION_MERGE_MIN_BS,
        MLA_PROJECTION_MERGE_TAIL_MS,
        MLA_TRITON_FIXED_MS,
        MLA_TRITON_REQUEST_MS,
        MLA_WGMMA_TAIL_MS,
        mla_decode_fixed_ms,
        mla_flat_plan_ms,
    )

    assert MLA_HEADS_PER_PROGRAM == triton_mla.BLOCK_H
    assert MLA_PROJECTION_MERGE_MAX_BS == mla_merge_projection.MAX_BS
    assert MLA_PROJECTION_MERGE_MIN_BS == mla_merge_projection.MIN_BS
    for hopper in (True, False):
        for heads in (16, 20, 128):
            for bs in range(1, 300):
                # decode_projected's range (one head block), then mla_decode_attention's
                projected = hopper and heads <= triton_mla.BLOCK_H and (
                    mla_merge_projection.MIN_BS <= bs <= mla_merge_projection.MAX_BS)
                wgmma = projected or (hopper and triton_mla.wgmma_serves(bs, heads))
                apart = triton_mla.mla_num_kv_splits(bs, heads) > triton_mla.FUSED_MERGE_SPLITS and not wgmma
                tail = MLA_PROJECTION_MERGE_TAIL_MS if projected else MLA_WGMMA_TAIL_MS
                own = tail if wgmma else 0.0 if hopper else min(bs * MLA_TRITON_REQUEST_MS, MLA_TRITON_FIXED_MS)
                fixed = own + (KERNEL_FLOOR_MS if apart else 0.0)
                got = mla_decode_fixed_ms(1, heads, np.array([bs]), hopper)[0]
                assert np.isclose(got, fixed), (hopper, heads, bs)
                # The step's plan (one kernel a forward) wherever stage 1 maps its chunks flat.
                flat = wgmma and gluon_mla_wgmma.flat_serves(heads)
                assert mla_flat_plan_ms(heads, np.array([bs]), hopper)[0] == (KERNEL_FLOOR_MS if flat else 0.0)


BOTH_MODELS = ("qwen3", "deepseek")
# deepseek-v2-lite alone: MLA decode's build as shipped (warpgroup-MMA stage 1), which touched no other model;
# the runs of the MLA builds before it are in git history (532ce70)
MLA_ONLY = ("deepseek",)


def _repredicted(folder: str) -> list[tuple]:
    """A recorded verify folder's runs predicted again by this checkout (benchmarks/repredict_verify.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("repredict", RESULTS.parent / "repredict_verify.py")
    repredict = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(repredict)
    return repredict.rows(RESULTS / folder)


def _assert_covers(rows: list[tuple], models: tuple[str, ...]) -> None:
    """Every model named, both sets, both kinds."""
    assert {(name.split("-")[0], graph_set, kind) for name, graph_set, kind, *_ in rows} == {
        (model, graph_set, kind) for model in models for graph_set in ("plan", "default")
        for kind in ("decode", "extend")}


@pytest.mark.parametrize(("folder", "models"), [
    ("h200-2026-11-26-moe-tma/call15/verify", BOTH_MODELS), ("h200-2026-11-26-moe-tma/call11/verify", BOTH_MODELS),
    ("h100-2026-11-26-moe-tma/call8/verify", BOTH_MODELS), ("h100-2026-11-26-pdl-tails/call4/verify", BOTH_MODELS),
    ("h100-2026-11-26-extend-split/call10/verify", BOTH_MODELS), ("h200-2026-11-26-night/verify", BOTH_MODELS),
    ("h200-h100-2026-11-27-mla-tail/call2-h200-verify/memory", MLA_ONLY),
    ("h200-h100-2026-11-27-mla-tail/call5-h100-verify/memory", MLA_ONLY),
    ("h200-h100-2026-11-27-mla-projection/call5/memory", MLA_ONLY),
], ids=["H200", "H200-before-tails", "H100-before-32-rows", "H100", "H100-heads-as-rows", "H200-heads-as-rows",
        "H200-mla-tail", "H100-mla-tail", "H200-mla-as-shipped"])
def test_recorded_verify_runs_are_predicted_within_15_percent_per_set_and_kind(folder, models):
    # issue 33's target: `cgtool verify` of the models named on the Azure example and the Mooncake
    # conversation trace (plan's and default's sets), predicted again by this checkout's roofline
    rows = _repredicted(folder)
    _assert_covers(rows, models)
    assert len(rows) == 8 * len(models)  # two traces
    for name, graph_set, kind, measured, _, now in rows:
        assert abs(measured / now - 1) <= 0.15, (name, graph_set, kind)


@pytest.mark.parametrize(("folder", "traces"), [(f"{SMALL_BATCHES}/call7-h200/memory", 3),
                                               ("h200-h100-2026-11-27-mla-tail/call5-h100-verify/memory", 2),
                                               ("h200-h100-2026-11-27-mla-projection/call5/memory", 2),
                                               ("h200-h100-2026-11-27-mla-projection/call7/memory", 1),
                                               ("h200-h100-2026-11-27-stage1-settings/call2-h200/memory", 1),
                                               ("h200-h100-2026-11-27-stage1-settings/call3-h100/memory", 1)],
                         ids=["H200-from-one-request", "H100-mla-tail", "H200", "H100", "H200-held-out", "H100-held-out"])
def test_mla_as_shipped_verify_runs_are_predicted_within_8_percent_decode_and_5_extend(folder, traces):
    # deepseek-v2-lite, predicted with the terms refitted to MLA decode's kernels and MLA extend
    # at 0.20 of peak (at 0.22 the Mooncake extend was 10% slower than predicted). As shipped
    # (the merge in the value projection, no copies in decode; H200 on both traces, H100 on the
    # Azure example): decode +1.5% to +5.2%, extend +0.0% to +2.2%; on the held-out slice (Azure
    # requests 10,001-11,000, which no fit has seen) decode +1.8% to +3.4%, extend +0.8% to
    # +1.4%. The build before, whose decode still launched two copies a layer that the terms no
    # longer price: decode +2.9% to +7.3%, extend +0.7% to +3.7%. With the projection's path
    # from one request (H200, 2026-11-28: the example, Mooncake and the held-out slice): decode
    # +2.8% to +4.4%, extend -1.1% to +0.3%. The H200's run of 2026-11-27 (mla-tail call 2), whose
    # bs 1-4 steps ran gluon_mla and its merge kernel, which the terms no longer price there, is
    # held to 15% above (Mooncake's decode +8.2% now).
    rows = _repredicted(folder)
    assert len(rows) == 4 * traces
    for name, graph_set, kind, measured, _, now in rows:
        assert abs(measured / now - 1) <= (0.08 if kind == "decode" else 0.05), (name, graph_set, kind)


def test_the_server_graph_gap_closes_deepseeks_decode_gap_in_verify():
    # deepseek-v2-lite's verify on three traces (H200, 2026-11-28) ran decode +2.8% to +4.4% past
    # its prediction while captures of the decode graphs alone ran within -3.2% to +1.3%: verify,
    # like a server, captures prefill graphs too, and then each kernel of a decode graph starts
    # 0.31-0.45 us later (benchmarks/results/h200-2026-11-28-graph-gaps). Priced, -0.7% to +1.3%.
    rows = _repredicted(f"{SMALL_BATCHES}/call7-h200/memory")
    decode = [measured / now - 1 for _, _, kind, measured, _, now in rows if kind == "decode"]
    assert len(decode) == 6 and max(abs(e) for e in decode) <= 0.03, decode


@pytest.mark.parametrize(("folder", "models"), [
    ("h200-h100-2026-11-27-heldout/call1-h200", BOTH_MODELS), ("h200-h100-2026-11-27-heldout/call2-h100", BOTH_MODELS),
    ("h200-h100-2026-11-27-moe-order/call3-h200/memory", BOTH_MODELS),
    ("h200-h100-2026-11-27-moe-order/call4-h100/memory", ("qwen3",)),
    ("h200-h100-2026-11-27-moe-joint/call7-h200/memory", BOTH_MODELS),
    ("h200-h100-2026-11-27-moe-joint/call10-h100/memory", BOTH_MODELS),
    ("h200-h100-2026-11-27-mla-flat-plan/call5-h200/memory", ("deepseek",)),
    ("h200-h100-2026-11-27-mla-flat-plan/call15-h200/memory", ("deepseek",)),
    ("h200-h100-2026-11-27-mla-merge-slots/call10-h200/memory", ("deepseek",)),
    ("h200-2026-11-27-heldout-recheck", ("deepseek",)),
    ("h200-h100-2026-11-27-mla-gluon-projection/call13-h200-verify", ("deepseek",)),
    ("h200-2026-11-28-mla-cap-check/call4-h200", ("deepseek",)),
    ("h200-2026-11-28-graph-gaps/call17-verify", BOTH_MODELS),
], ids=["H200", "H100", "H200-expert-major", "H100-expert-major", "H200-joint-gate-up", "H100-joint-gate-up",
        "H200-mla-flat-plan", "H200-mla-projection-from-5", "H200-mla-merge-slots", "H200-mla-range-read",
        "H200-mla-gluon-projection", "H200-mla-capped-plan", "H200-server-graph-gap"])
def test_verify_runs_on_traffic_no_fit_has_seen_are_predicted_within_7_percent(folder, models):
    # Requests 10,001-11,000 of the Azure conversation trace, plan's and default's sets: -3.1% to
    # +4.9% with these terms; deepseek-v2-lite's decode +1.6% to +3.9%, against +3.1% to +6.3%
    # before MLA's copies from two rows were priced (and its extend +5.4% to +7.2% before the MLA
    # refits of 2026-11-27). With the MoE gate/up GEMM's tiles expert-major (2026-11-27, the
    # build then): H200 -0.9% to +5.2% (both models), H100 -3.1% to +0.7% (qwen3-30b-a3b). With the
    # gate/up whole tiles' two products as one: H200 -0.7% to +5.2%, H100 -3.0% to +2.5%. With MLA
    # decode's flat plan once a forward, deepseek-v2-lite on the H200: -0.4% to +3.4%; with the
    # merge in the value projection from 5 requests: +0.1% to +3.8%; with its merge over slots
    # past four chunks: -0.6% to +2.8%; with its slots read by range and its product transposed
    # (its verify and plan packed as .xz): -0.8% to +2.5%; with the Gluon projection: +0.2% to
    # +3.4%; with the step's chunks capped to a projection step and its two-step programs (as
    # shipped, 2026-11-28): -1.1% to +2.0%. With the server's graph gap priced (2026-11-28, plans made
    # with it, both models): decode -3.4% to -0.7%, extend -1.1% to +0.3%.
    rows = _repredicted(folder)
    _assert_covers(rows, models)
    for name, graph_set, kind, measured, _, now in rows:
        assert abs(measured / now - 1) <= 0.07, (name, graph_set, kind)


def test_moe_layer_terms_hold_at_every_small_decode_batch():
    # H100, one MoE layer at 1-32 tokens (the other runs took 1, 8, 64 and 256): within 10%,
    # measured 0-4% above the terms for deepseek-v2-lite and 1-8% for qwen3-30b-a3b.
    run = (RESULTS / "h100-2026-11-27-moe-small-bs", "H100-80GB", "H100")
    for model in MODELS:
        cfg = load_model_config(model)
        rows = _moe_rows(run, "moe-mla.json", model, [1, 2, 3, 4, 6, 8, 12, 16, 24, 32])
        for row in rows:
            assert abs(_layer_error(row["layer_us"], cfg, "H100-80GB", row["tokens"])) <= 0.10, (model, row["tokens"])


# Censuses of every kernel in captured decode forwards at bs 1-64 (H200, 2026-11-27,
# benchmarks/kernel_census.py): qwen3-30b-a3b's before MLA's changes (which do not touch it),
# deepseek-v2-lite's as shipped (2026-11-28), the merge in the value projection from one request
# and no copies.
CENSUS = {
    "qwen3-30b-a3b": RESULTS / "h200-h100-2026-11-27-mla-flat/call1-h200-census/census.json",
    "deepseek-v2-lite": RESULTS / SMALL_BATCHES / "call6-h200/census.json",
}
MOE_FAMILIES = ("_router_route_kernel", "_router_kernel", "_route_kernel", "_align_one_program", "_grouped_gemm_kernel",
                "_combine_kernel")


@pytest.mark.parametrize("model", sorted(CENSUS))
def test_the_kernels_priced_apart_are_the_ones_a_captured_forward_launches(model):
    # Each MoE layer launches the kernels the terms count for it (MOE_KERNELS_ONE_TOKEN at one
    # token, MOE_KERNELS_SMALL past it); MLA's merge is a kernel of its own exactly where
    # mla_decode_fixed_ms prices a second kernel's floor (fewer than MLA_FUSED_MERGE_ROWS rows,
    # gluon_mla_wgmma's bs range apart), the value projection's kernel merges exactly up to
    # MLA_PROJECTION_MERGE_MAX_BS, and no copy joins a forward past one row: the decode terms
    # price none.
    from cgtool.planner.kernel_terms import (
        MLA_FUSED_MERGE_ROWS,
        MLA_PROJECTION_MERGE_MAX_BS,
        MLA_PROJECTION_MERGE_MIN_BS,
        MLA_WGMMA_MAX_BS,
        MLA_WGMMA_MIN_BS,
        MOE_KERNELS_ONE_TOKEN,
        MOE_KERNELS_SMALL,
        MOE_ONE_TOKEN_PATH,
    )

    (run,) = [r for r in _load(CENSUS[model].parent, CENSUS[model].name) if r["model"] == model]
    cfg = load_model_config(model)
    assert len(run["sizes"]) == 11
    one_row = run["sizes"]["1"]["families"]
    for bs, size in ((int(k), v) for k, v in run["sizes"].items()):
        assert size["kernels"] == size["report_kernels_per_forward"]  # the trace holds the report's count
        families = size["families"]
        moe = sum(families.get(name, [0])[0] for name in MOE_FAMILIES)
        per_layer = MOE_KERNELS_ONE_TOKEN if bs <= MOE_ONE_TOKEN_PATH else MOE_KERNELS_SMALL
        assert moe == cfg.num_moe_layers * per_layer, bs
        if cfg.mla is not None:  # 16 heads: one program's rows a request
            projected = MLA_PROJECTION_MERGE_MIN_BS <= bs <= MLA_PROJECTION_MERGE_MAX_BS
            wgmma = projected or MLA_WGMMA_MIN_BS <= bs <= MLA_WGMMA_MAX_BS
            merge_apart = bs < MLA_FUSED_MERGE_ROWS and not wgmma
            assert families.get("_mla_merge_kernel", [0])[0] == (cfg.num_layers if merge_apart else 0), bs
            assert families.get("_merge_project_kernel", [0])[0] == (cfg.num_layers if projected else 0), bs
            copies = families["at::native::elementwise_kernel"][0] - one_row["at::native::elementwise_kernel"][0]
            assert copies == 0, bs


def test_mla_copies_are_priced_in_extend_alone(monkeypatch):
    # Extend's compiled pieces keep MLA_EXTEND_COPIES_FROM_TWO_ROWS copies a layer, each at
    # OTHER_KERNEL_FLOOR_MS, from two tokens; decode launches none (the census above); a model
    # without MLA pays none.
    import cgtool.planner.cost as cost_module
    from cgtool.planner.kernel_terms import MLA_EXTEND_COPIES_FROM_TWO_ROWS, OTHER_KERNEL_FLOOR_MS

    def tables(model: str) -> tuple:
        cost = roofline_cost(load_model_config(model), gpu_spec("H200"), max_bs=8, max_tokens=8)
        return cost.decode_graph_ms, cost.extend_graph_ms

    priced = {model: tables(model) for model in MODELS}
    monkeypatch.setattr(cost_module, "mla_extend_copies_ms", lambda layers, rows: rows * 0.0)
    unpriced = {model: tables(model) for model in MODELS}
    cfg = load_model_config("deepseek-v2-lite")
    price = cfg.num_layers * MLA_EXTEND_COPIES_FROM_TWO_ROWS * OTHER_KERNEL_FLOOR_MS
    (decode, extend), (decode_unpriced, extend_unpriced) = priced["deepseek-v2-lite"], unpriced["deepseek-v2-lite"]
    assert (decode == decode_unpriced).all()
    gap = extend - extend_unpriced
    assert gap[1] == 0 and (abs(gap[2:] - price) < 1e-12).all()
    for with_copies, without in zip(priced["qwen3-30b-a3b"], unpriced["qwen3-30b-a3b"], strict=True):
        assert (with_copies == without).all()
