"""Which GPU class a device is, for the few launch settings that measured differently by class
(docs/moe-mla.md): the H100's and the H200's HBM and clocks differ, and so do a few kernels'
best settings."""

from __future__ import annotations

from functools import cache

import torch


@cache
def device_name(device_index: int) -> str:
    return torch.cuda.get_device_name(device_index)


def is_h100(device_index: int) -> bool:
    return "H100" in device_name(device_index)


def is_h200(device_index: int) -> bool:
    return "H200" in device_name(device_index)
