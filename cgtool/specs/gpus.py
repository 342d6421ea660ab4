"""Datasheet figures of common serving GPUs, and NVML detection of the local one."""

from __future__ import annotations

from dataclasses import dataclass

from cgtool.errors import CgtoolError
from cgtool.units import MIB


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    memory_bytes: int  # as NVML reports total memory, not the marketing figure
    bandwidth_bytes_s: float  # HBM/GDDR peak from the datasheet
    bf16_flops: float  # dense bf16 tensor-core peak
    nvml_names: tuple[str, ...]
    # GPU-to-GPU link for tensor parallelism within one node: per-direction peak and the
    # latency of one small all-reduce. Estimates: their sources are beside the table.
    link_bytes_s: float = 0.0
    link_latency_s: float = 0.0
    sm_count: int = 0  # streaming multiprocessors (datasheet); sizes SGLang's SM-wide buffers
    hopper: bool = False  # compute capability 9: where cgtool's Gluon MLA decode kernels run


# GPU-to-GPU links (per direction; estimates, not measured here). NVLink 4 (H100/H200 SXM)
# is 900 GB/s both ways, 450 each; NVLink 5 (B200) 1.8 TB/s, 900 each; NVLink 3 (A100 SXM)
# 600 GB/s, 300 each (NVIDIA datasheets). PCIe cards without a bridge go through the switch:
# Gen5 x16 64 GB/s, Gen4 x16 32 GB/s per direction. Latencies are of one small all-reduce:
# ~8 us for SGLang's custom all-reduce over NVLink, ~20 us for NCCL over PCIe (typical of
# nccl-tests and SGLang's all-reduce benchmarks at a few KB).
_NVLINK5 = (900e9, 8e-6)
_NVLINK4 = (450e9, 8e-6)
_NVLINK3 = (300e9, 10e-6)
_PCIE5 = (64e9, 20e-6)
_PCIE4 = (32e9, 20e-6)

# Datasheet peaks (dense, no sparsity); memory as NVML reports it on each card.
GPU_SPECS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        GpuSpec(
            "H100-80GB", 81559 * MIB, 3.35e12, 989e12, ("H100 80GB HBM3", "H100 SXM"), *_NVLINK4,
            sm_count=132, hopper=True,
        ),
        GpuSpec("H100-PCIe", 81559 * MIB, 2.0e12, 756e12, ("H100 PCIe",), *_PCIE5, sm_count=114, hopper=True),
        GpuSpec("H200", 143771 * MIB, 4.8e12, 989e12, ("H200",), *_NVLINK4, sm_count=132, hopper=True),
        GpuSpec(
            "A100-80GB", 81920 * MIB, 2.039e12, 312e12, ("A100-SXM4-80GB", "A100 80GB"), *_NVLINK3,
            sm_count=108,
        ),
        # The 40 GB entry takes the SXM part's link; its PCIe card is nearer _PCIE4.
        GpuSpec(
            "A100-40GB",
            40960 * MIB,
            1.555e12,
            312e12,
            ("A100-SXM4-40GB", "A100-PCIE-40GB"),
            *_NVLINK3,
            sm_count=108,
        ),
        GpuSpec("L40S", 46068 * MIB, 0.864e12, 362e12, ("L40S",), *_PCIE4, sm_count=142),
        GpuSpec("L4", 23034 * MIB, 0.300e12, 121e12, ("L4",), *_PCIE4, sm_count=58),
        GpuSpec("A10", 23028 * MIB, 0.600e12, 125e12, ("A10",), *_PCIE4, sm_count=72),
        GpuSpec("RTX-4090", 24564 * MIB, 1.008e12, 165e12, ("RTX 4090",), *_PCIE4, sm_count=128),
        GpuSpec("B200", 183359 * MIB, 8.0e12, 2250e12, ("B200",), *_NVLINK5, sm_count=148),
    )
}


def gpu_spec(name: str) -> GpuSpec:
    """Look a GPU up by its table name (case-insensitive) or `auto` for the local one."""
    if name.lower() == "auto":
        return detect_gpu()
    for key, spec in GPU_SPECS.items():
        if key.lower() == name.lower():
            return spec
    raise CgtoolError(
        f"unknown GPU '{name}' (--gpu)", f"Use one of: {', '.join(GPU_SPECS)}, or auto."
    )


def match_nvml_name(nvml_name: str) -> GpuSpec | None:
    # Longest pattern first so "H100 PCIe" wins over a bare "H100" style match.
    candidates = [(p, s) for s in GPU_SPECS.values() for p in s.nvml_names]
    for pattern, spec in sorted(candidates, key=lambda c: -len(c[0])):
        if pattern.lower() in nvml_name.lower():
            return spec
    return None


def detect_gpu() -> GpuSpec:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else name
    except Exception:
        raise CgtoolError(
            "no NVIDIA GPU found for --gpu auto",
            f"Name one with --gpu ({', '.join(GPU_SPECS)}).",
        ) from None
    spec = match_nvml_name(name)
    if spec is None:
        raise CgtoolError(
            f"GPU '{name}' is not in cgtool's table", f"Name the closest with --gpu ({', '.join(GPU_SPECS)})."
        )
    return spec
