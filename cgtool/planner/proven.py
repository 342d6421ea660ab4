"""`--mem-fraction-static` as a verify.json proved it, or a note that it is only predicted.

`cgtool verify` rehearses the plan's graphs and worst eager steps at the plan's fraction,
then at the fraction that leaves its headroom free (cgtool.verify.proof); a profile made from
that verify.json carries the result as `memory_proof`. The plan then recommends the fraction a
rehearsal passed, and never one that failed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cgtool.documents.plan_document import PlanMemory
from cgtool.planner.margin import CALIBRATED
from cgtool.planner.memory import kv_tokens_at
from cgtool.planner.memory_terms import family as model_family
from cgtool.planner.parallel import rank_shapes
from cgtool.specs.config import ModelConfig
from cgtool.specs.gpus import GpuSpec, match_nvml_name
from cgtool.units import BF16_BYTES, GIB

__all__ = ["apply_proof", "model_family"]


def apply_proof(
    memory: PlanMemory, profile: dict[str, Any] | None, cfg: ModelConfig, gpu: GpuSpec, tp_size: int = 1
) -> tuple[PlanMemory, list[str]]:
    """(memory at the proven fraction, notes). Without a proof for this model on this GPU the
    predicted fraction stays, capped below any fraction that failed; a family whose terms were
    never measured on this GPU class gets a one-line note that its fraction is unproven."""
    proof = _proof_for(profile, cfg, gpu)
    if proof is None:
        calibrated = (gpu.name, model_family(cfg)) in CALIBRATED
        return replace(memory, fraction_source="predicted"), [] if calibrated else [_unproven_note(memory, cfg, gpu)]
    proven = proof.get("recommended_mem_fraction_static")
    failed = [float(f) for f in proof.get("failed_mem_fraction_static") or []]
    if proven is not None:
        headroom = int(proof.get("headroom_bytes") or 0) / GIB
        note = (f"--mem-fraction-static {float(proven):.3f} was proven on this GPU by verify "
                f"({headroom:.2f} GiB free at the worst step); it holds for the verified plan's graphs")
        return _at(memory, float(proven), cfg, tp_size, "proven"), [note]
    fraction = memory.mem_fraction_static
    if failed and fraction >= min(failed):
        fraction = round(min(failed) - 0.01, 3)  # strictly below what failed, never at it
    return _at(memory, fraction, cfg, tp_size, "predicted"), [
        (f"no fraction passed verify's rehearsal ({', '.join(f'{f:g}' for f in failed)} failed); "
         f"--mem-fraction-static {fraction:.3f} is unproven: run `cgtool verify --plan plan.json` again")
    ]


def _at(memory: PlanMemory, fraction: float, cfg: ModelConfig, tp_size: int, source: str) -> PlanMemory:
    tokens = kv_tokens_at(cfg, memory.gpu_memory_bytes, fraction, tp_size)
    per_token = rank_shapes(cfg, tp_size).kv_bytes_per_token(BF16_BYTES)
    return replace(memory, mem_fraction_static=fraction, kv_tokens=tokens,
                   kv_bytes=int(tokens * per_token), fraction_source=source)


def _proof_for(profile: dict[str, Any] | None, cfg: ModelConfig, gpu: GpuSpec) -> dict[str, Any] | None:
    proof = (profile or {}).get("memory_proof")
    if not isinstance(proof, dict) or proof.get("model") != cfg.name:
        return None
    measured_on = match_nvml_name(str(proof.get("gpu_name", "")))
    return proof if measured_on is not None and measured_on.name == gpu.name else None


def _unproven_note(memory: PlanMemory, cfg: ModelConfig, gpu: GpuSpec) -> str:
    return (f"--mem-fraction-static {memory.mem_fraction_static:.3f} is predicted, not proven, for "
            f"{model_family(cfg)} models on {gpu.name}: prove it with `cgtool verify --plan plan.json` "
            "on that GPU, then `cgtool plan --profile verify.json`")
