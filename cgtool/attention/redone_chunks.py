"""How many chunks MLA decode's stage 1 did twice: a count a report can show.

gluon_mla_wgmma scales a chunk's scores by a fixed maximum (FIXED_MAX) and does the chunk again
with a running maximum where its scores leave that maximum's range. The answer is right either
way, but a chunk done twice costs about a second stage 1, and random weights never leave the
range, so only a run over a user's own weights can say whether their heads do. Each chunk
redone adds one to a device's counter here. `capture` reads it around one more replay of each
decode size, `verify` around each set's timed steps.

One counter a device, shared by every layer and graph, as tickets are. A graph keeps its
address, so it is made once and never freed; `reset` makes it outside any capture (a zeroing
captured into a graph would zero it again at every replay).
"""

from __future__ import annotations

from typing import Any

import torch

_COUNTERS: dict[tuple[str, int], torch.Tensor] = {}


def _key(device: torch.device | str) -> tuple[str, int]:
    device = torch.device(device)
    if device.index is not None:
        return device.type, device.index
    return device.type, torch.cuda.current_device() if device.type == "cuda" else 0


def counter(device: torch.device | str) -> torch.Tensor:
    """The device's int32 counter of redone chunks ([1]), made at zero on first use."""
    key = _key(device)
    found = _COUNTERS.get(key)
    if found is None:
        found = _COUNTERS[key] = torch.zeros(1, dtype=torch.int32, device=torch.device(*key))
    return found


def reset(device: torch.device | str) -> None:
    """Sets the device's counter to zero (making it if needed); call it outside a capture."""
    counter(device).zero_()


def counted(runner: Any) -> bool:
    """Whether a model runner's decode steps count redone chunks: an MLA model (a latent pool)
    on a GPU where gluon_mla_wgmma serves with its fixed maximum."""
    from cgtool.attention import gluon_mla_wgmma  # it imports this module

    return bool(runner.kv_pool.is_latent) and gluon_mla_wgmma.counts_redone(runner.device)


def read(device: torch.device | str) -> int:
    """Chunks redone on the device since its last `reset` (synchronises)."""
    return int(counter(device).item())
