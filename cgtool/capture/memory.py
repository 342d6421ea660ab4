"""Memory as the allocator, the graph pool and the driver (NVML) each see it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from cgtool.units import BYTE_UNITS


@dataclass(frozen=True, slots=True)
class MemoryReading:
    pool_bytes: int  # segments owned by the global graph pool
    reserved_bytes: int  # everything torch's caching allocator holds
    device_used_bytes: int  # what the driver says the device has in use
    free_bytes: int

    @property
    def non_torch_bytes(self) -> int:
        """Graph objects, cuBLAS workspaces, CUDA context: memory the allocator never sees."""
        return self.device_used_bytes - self.reserved_bytes


def graph_pool_bytes(pool: Any) -> int:
    """Bytes of the segments that belong to `pool` (a torch.cuda.graph_pool_handle())."""
    pool_id = tuple(pool) if isinstance(pool, (tuple, list)) else pool
    total = 0
    for segment in torch.cuda.memory_snapshot():
        if tuple(segment.get("segment_pool_id", ())) == pool_id:
            total += segment["total_size"]
    return total


def read_memory(pool: Any) -> MemoryReading:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return MemoryReading(
        pool_bytes=graph_pool_bytes(pool) if pool is not None else 0,
        reserved_bytes=torch.cuda.memory_reserved(),
        device_used_bytes=total - free,
        free_bytes=free,
    )


def device_info() -> dict[str, Any]:
    """GPU name, total memory and driver as NVML reports them (empty strings when it can't)."""
    props = torch.cuda.get_device_properties(0)
    info = {"gpu_name": props.name, "gpu_memory_bytes": int(props.total_memory), "driver": ""}
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        info["driver"] = driver.decode() if isinstance(driver, bytes) else driver
    except Exception:  # NVML missing in a container is not worth failing a capture for
        pass
    return info


_TRIED = re.compile(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)")


def oom_request_bytes(message: str) -> int:
    """The allocation PyTorch's out-of-memory message names (0 if it names none): at least
    this much more was needed."""
    match = _TRIED.search(message)
    return int(float(match.group(1)) * BYTE_UNITS[match.group(2).lower()]) if match else 0
