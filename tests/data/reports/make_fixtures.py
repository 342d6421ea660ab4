"""Write the SYNTHETIC fixture report and plan in this folder (not measurements).

The figures follow simple formulas shaped like an H100 80GB run of llama-3.1-8b with
SGLang's default 36 decode batch sizes and six piecewise token counts, so that rendering
and `check` have realistic input before real reports land. Run from the repo root:
    .venv/bin/python tests/data/reports/make_fixtures.py
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from cgtool.documents.results import (
    Artifacts,
    CaptureReport,
    CaptureSettings,
    CaptureTotals,
    Environment,
    KernelRow,
    ModelInfo,
    Provenance,
    SizeResult,
    write_json_atomic,
)
from cgtool.specs.config import load_preset
from cgtool.specs.gpus import GPU_SPECS

HERE = Path(__file__).parent
MIB = 1 << 20
FIXTURE_NOTE = "SYNTHETIC FIXTURE for tests: formula-made figures, not a measurement"
DECODE_BS = [1, 2, 4, 8, 12] + list(range(16, 257, 8))  # SGLang's default for max_bs 256
PIECEWISE_TOKENS = [128, 256, 512, 1024, 2048, 4096]
SPEC = GPU_SPECS["H100-80GB"]
CONFIG = load_preset("llama-3.1-8b")
KERNELS_PER_LAYER = 14
# Made up like the figures: no commit measured anything here.
PROVENANCE = Provenance(commit="unknown", dirty=None,
                        command=["python", "tests/data/reports/make_fixtures.py"],
                        cpu_model="fixture-synthetic", cpu_count=2, cgtool="0.1.0",
                        torch="2.13.0", python="3.11")


def _roofline_ms(num_tokens: int) -> float:
    weights_s = CONFIG.weight_bytes() / SPEC.bandwidth_bytes_s
    flops_s = 2 * CONFIG.param_count() * num_tokens / SPEC.bf16_flops
    return 1e3 * max(weights_s, flops_s)


def _decode_row(bs: int, first: bool) -> SizeResult:
    replay_ms = _roofline_ms(bs) / 0.8 + 0.012 * bs
    launch_ms = 2.1 * max(0.15, 1 - bs / 300)  # eager launch cost, hidden at large batches
    eager_ms = replay_ms + launch_ms
    retained = 256 * MIB if first else (6 + int(0.9 * bs / 8)) * MIB
    return SizeResult(
        kind="decode", size=bs, capture_s=round(0.15 + 0.0008 * bs, 4),
        retained_bytes=retained, peak_bytes=retained + 64 * MIB,
        non_torch_bytes=(32 if first else 1) * MIB + (bs % 3) * 512 * 1024,
        eager_ms=round(eager_ms, 4), replay_ms=round(replay_ms, 4),
        speedup=round(eager_ms / replay_ms, 4),
        kernels_per_forward=KERNELS_PER_LAYER * CONFIG.num_layers + 4,
        max_abs_diff=0.0078125 if bs % 5 == 0 else 0.0, roofline_ms=round(_roofline_ms(bs), 4),
    )


def _piecewise_row(tokens: int, first: bool) -> SizeResult:
    replay_ms = _roofline_ms(tokens) / 0.65 + 0.002 * tokens
    eager_ms = replay_ms + 1.6
    retained = 420 * MIB if first else (4 + tokens // 64) * MIB
    return SizeResult(
        kind="piecewise", size=tokens, capture_s=round(0.6 + 0.0004 * tokens, 4),
        retained_bytes=retained, peak_bytes=retained + tokens * 96 * 1024,
        non_torch_bytes=2 * MIB, eager_ms=round(eager_ms, 4), replay_ms=round(replay_ms, 4),
        speedup=round(eager_ms / replay_ms, 4),
        kernels_per_forward=(KERNELS_PER_LAYER - 1) * CONFIG.num_layers + 4,
        max_abs_diff=0.015625, roofline_ms=round(_roofline_ms(tokens), 4),
    )


def _kernel_table(num_tokens: int) -> list[KernelRow]:
    scale = _roofline_ms(num_tokens) / 0.8
    shares = [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas", 0.71, 128),
        ("_decode_attention_split_kv_kernel", 0.09, 32),
        ("_rms_norm_kernel", 0.05, 65),
        ("silu_and_mul_kernel", 0.06, 32),
        ("rotary_embedding_kernel", 0.03, 32),
        ("elementwise_add_kernel", 0.04, 64),
        ("store_kv_cache_kernel", 0.02, 32),
    ]
    return [KernelRow(name, round(share * scale, 4), n) for name, share, n in shares]


def build_report() -> CaptureReport:
    decode = [_decode_row(bs, i == 0) for i, bs in enumerate(sorted(DECODE_BS, reverse=True))]
    pieces = [_piecewise_row(n, i == 0)
              for i, n in enumerate(sorted(PIECEWISE_TOKENS, reverse=True))]
    sizes = decode + pieces
    weights = CONFIG.weight_bytes()
    kv_pool = int(0.88 * SPEC.memory_bytes) - weights
    graph_pool = sum(s.retained_bytes for s in sizes)
    non_torch = sum(s.non_torch_bytes for s in sizes)
    free_before = SPEC.memory_bytes - weights - kv_pool - 900 * MIB
    return CaptureReport(
        environment=Environment("NVIDIA H100 80GB HBM3", SPEC.memory_bytes, "550.54.15", "12.4",
                                "2.13.0", "0.1.0", "fixture-synthetic"),
        model=ModelInfo("llama-3.1-8b", CONFIG.architecture, CONFIG.config_hash(), "bfloat16",
                        weights, CONFIG.num_layers),
        settings=CaptureSettings(["decode", "piecewise"], DECODE_BS, PIECEWISE_TOKENS, "eager",
                                 0.88, "triton", 8192, False),
        sizes=sizes,
        totals=CaptureTotals(
            weights_bytes=weights, kv_pool_bytes=kv_pool,
            kv_tokens=kv_pool // CONFIG.kv_bytes_per_token(), graph_pool_bytes=graph_pool,
            peak_bytes=weights + kv_pool + graph_pool + 700 * MIB,
            free_before_capture_bytes=free_before,
            free_after_capture_bytes=free_before - graph_pool - non_torch,
            capture_s=round(sum(s.capture_s for s in sizes), 3), non_torch_bytes=non_torch,
            copy_bandwidth_bytes_s=2.6e12,
        ),
        artifacts=Artifacts(
            memory_snapshot="memory_snapshot.pickle", chrome_trace=None,
            kernel_tables={"decode:1": _kernel_table(1), "decode:256": _kernel_table(256),
                           "piecewise:4096": _kernel_table(4096)},
        ),
        created="2026-05-01T12:00:00+00:00",
        provenance=PROVENANCE,
    )


def build_oom_report() -> CaptureReport:
    """The same run cut short: decode bs 256 ran out of memory, piecewise never started."""
    report = build_report()
    failed = report.sizes[0]
    failed.status, failed.eager_ms, failed.replay_ms, failed.speedup = "failed", None, None, None
    failed.max_abs_diff, failed.capture_s, failed.retained_bytes = None, 0.0, 0
    report.sizes = [s for s in report.sizes if s.kind == "decode"]
    report.status = "incomplete"
    report.incomplete_reason = ("out of memory capturing decode bs 256 with 0.21 GiB free; "
                                "lower --cuda-graph-max-bs to 248")
    report.artifacts = Artifacts()
    totals = report.totals
    totals.graph_pool_bytes = sum(s.retained_bytes for s in report.sizes)
    totals.non_torch_bytes = sum(s.non_torch_bytes for s in report.sizes)
    totals.capture_s = round(sum(s.capture_s for s in report.sizes), 3)
    totals.free_after_capture_bytes = (totals.free_before_capture_bytes - totals.graph_pool_bytes
                                       - totals.non_torch_bytes)
    return report


def build_plan() -> dict:
    bs_sizes = list(range(1, 161))
    bs_counts = [int(900 * 2.718 ** (-abs(b - 48) / 22)) + 3 for b in bs_sizes]
    tok_sizes = list(range(64, 8193, 64))
    tok_counts = [int(400 * 2.718 ** (-t / 1500)) + 1 for t in tok_sizes]
    weights = CONFIG.weight_bytes()
    plan_graph = 640 * MIB
    default_graph = 1410 * MIB
    return {
        "_fixture": FIXTURE_NOTE,
        "schema": "cgtool.plan", "version": "1.0", "status": "complete",
        "created": "2026-05-01T12:00:00+00:00",
        "provenance": dataclasses.asdict(PROVENANCE),
        "inputs": {"trace": "fixture-trace.jsonl", "trace_kind": "requests",
                   "model": "llama-3.1-8b", "gpu": "H100-80GB", "engine": "sglang",
                   "engine_version": "0.4", "profile": None, "tp_size": 1,
                   "chunked_prefill_size": 8192, "max_running_requests": 256,
                   "context_len": 8192},
        "decode": {"capture_bs": [1, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 128, 160],
                   "max_bs": 160,
                   "histogram": {"sizes": bs_sizes, "counts": bs_counts,
                                 "time_s": [round(c * 0.0075, 3) for c in bs_counts]},
                   "default_capture_bs": DECODE_BS},
        "piecewise": {"capture_num_tokens": [256, 512, 1024, 2048, 4096, 8192],
                      "max_tokens": 8192,
                      "histogram": {"sizes": tok_sizes, "counts": tok_counts,
                                    "time_s": [round(c * 0.05, 3) for c in tok_counts]},
                      "default_capture_num_tokens": PIECEWISE_TOKENS},
        "memory": {"gpu_memory_bytes": SPEC.memory_bytes, "weights_bytes": weights,
                   "graph_bytes": plan_graph, "activation_bytes": 3 * 1024 * MIB,
                   "margin_bytes": 1024 * MIB,
                   "kv_bytes": SPEC.memory_bytes - weights - plan_graph - 4096 * MIB,
                   "kv_tokens": (SPEC.memory_bytes - weights - plan_graph - 4096 * MIB) // 131072,
                   "mem_fraction_static": 0.9423, "default_mem_fraction_static": 0.88,
                   "default_kv_tokens": 451000, "peak_kv_demand_tokens": 390000,
                   "warnings": []},
        "comparison": [
            {"schedule": "plan", "expected_step_ms": 8.91, "decode_coverage": 1.0,
             "extend_coverage": 0.97, "padding_waste": 0.031, "num_graphs": 20,
             "graph_bytes": plan_graph, "capture_s": 9.8, "kv_tokens": 482000},
            {"schedule": "default", "expected_step_ms": 9.34, "decode_coverage": 1.0,
             "extend_coverage": 0.81, "padding_waste": 0.064, "num_graphs": 42,
             "graph_bytes": default_graph, "capture_s": 14.1, "kv_tokens": 451000},
        ],
        "flags": {"sglang": ["--cuda-graph-bs 1 4 8 16 24 32 40 48 56 64 80 96 128 160",
                             "--piecewise-cuda-graph-tokens 256 512 1024 2048 4096 8192",
                             "--mem-fraction-static 0.9423"],
                  "vllm": ["--max-num-seqs 160"], "trtllm": []},
        "simulation": {"num_requests": 20000, "dropped_requests": 0, "duration_s": 1800.0,
                       "steps": 190000, "mean_queue_s": 0.04, "p99_queue_s": 0.9},
    }


def main() -> None:
    for folder, report in (("h100-llama-3.1-8b", build_report()),
                           ("h100-llama-3.1-8b-oom", build_oom_report())):
        (HERE / folder).mkdir(exist_ok=True)
        write_json_atomic(HERE / folder / "report.json", {"_fixture": FIXTURE_NOTE} | report.to_dict())
    (HERE / "plan-llama-3.1-8b").mkdir(exist_ok=True)
    write_json_atomic(HERE / "plan-llama-3.1-8b" / "plan.json", build_plan())


if __name__ == "__main__":
    main()
