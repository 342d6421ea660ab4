"""The margin a --mem-fraction-static keeps free beyond activations and graphs, part by part.

Every figure was measured on an H100 80GB HBM3 (driver 580.159, CUDA 13, torch 2.11) on
2026-11-26 by benchmarks/bench_memory_parts.py and `cgtool verify` (raw files in
benchmarks/results/h100-2026-11-26-memory; tests/test_margin.py reads them):

- cuda_context: what the device holds once torch has initialised CUDA, before any tensor
  of note (parts-call1.json cuda_context_bytes: 619 MiB);
- cublas_workspaces: what the first GEMM on a stream adds outside torch's allocator, for the
  forward's stream and a capture's (66 + 70 MiB);
- sampler_logits: SGLang's fp32 next-token logits at --max-running-requests and the
  sampler's temporaries over them: 12.0-12.1 bytes a logit at the peak of a temperature,
  softmax and sample over fp32 logits of 256 and 1,024 rows (1,782 MiB at [1,024, 151,936]);
- first_forward: kernels and workspaces the process loads during its first forward and
  capture, which every later capture finds loaded: verify's plan set measured the first time
  in a process minus the same set captured again at the proven fraction (0.32, 0.50-0.52 and
  0.94-0.96 GiB) less the new graph objects the first capture alone paid for (8 KiB a node,
  cgtool.planner.memory_terms), taken from the runs on today's kernels
  (benchmarks/results/h100-2026-11-26-memory-proof): llama-3.1-8b 149-159 MiB, qwen3-30b-a3b
  31-142 MiB, deepseek-v2-lite 61-81 MiB (its MLA kernels before commit 7650258 loaded 624-630);
- fragmentation: what the caching allocator reserves beyond the bytes it hands out at an
  eager extend's peak: up to 72% of the activations (deepseek-v2-lite at 2,048 tokens,
  370 MiB reserved for 215 MiB allocated; 53% at 8,192; llama-3.1-8b 3%);
- headroom: what verify's proof leaves free at the worst step (its --headroom default);
- nccl: under tensor parallelism, SGLang's own rule of tp_size / 8 GiB (not measured).
"""

from __future__ import annotations

from cgtool.specs.config import ModelConfig
from cgtool.units import GIB, MIB

CUDA_CONTEXT_BYTES = 619 * MIB
CUBLAS_WORKSPACE_BYTES = (66 + 70) * MIB
SAMPLER_BYTES_PER_LOGIT = 12.1
FIRST_FORWARD_BYTES = {"dense": 165 * MIB, "MoE": 155 * MIB, "MLA": 90 * MIB}
FRAGMENTATION_SHARE = 0.72
HEADROOM_BYTES = 3 * GIB // 2
COMM_RESERVE_BYTES_PER_RANK = GIB // 8


def named_margin(
    cfg: ModelConfig, max_running_requests: int, extend_activation_bytes: int, tp_size: int = 1
) -> dict[str, int]:
    """{part: bytes} of one GPU's margin; no part is a share of the GPU's memory."""
    from cgtool.planner.memory_terms import family

    parts = {
        "cuda_context": CUDA_CONTEXT_BYTES,
        "cublas_workspaces": CUBLAS_WORKSPACE_BYTES,
        "sampler_logits": int(max_running_requests * cfg.vocab_size * SAMPLER_BYTES_PER_LOGIT),
        "first_forward": FIRST_FORWARD_BYTES[family(cfg)],
        "fragmentation": int(FRAGMENTATION_SHARE * extend_activation_bytes),
        "headroom": HEADROOM_BYTES,
    }
    if tp_size > 1:
        parts["nccl"] = tp_size * COMM_RESERVE_BYTES_PER_RANK
    return parts


# (GPU, family) whose terms and margin were measured and whose fraction verify proved: these
# benchmarks/results/h100-2026-11-26-memory runs. Any other pair is planned unproven.
CALIBRATED = frozenset({("H100-80GB", "dense"), ("H100-80GB", "MoE"), ("H100-80GB", "MLA")})

# Each part's source, for the plan's memory table and docs/memory.md.
SOURCES = {
    "cuda_context": "measured, H100",
    "cublas_workspaces": "measured, two streams, H100",
    "sampler_logits": "12.1 B a logit x requests x vocab",
    "first_forward": "measured by verify, per family",
    "fragmentation": "72% of the extend's activations",
    "headroom": "verify --headroom",
    "nccl": "SGLang's tp / 8 GiB rule",
}
