"""cgtool.runtime.gpu_class: a device's class from its name, asked of CUDA once a device."""

from __future__ import annotations

import pytest
import torch

from cgtool.runtime import gpu_class


@pytest.mark.parametrize(("name", "h100", "h200"), [
    ("NVIDIA H100 80GB HBM3", True, False), ("NVIDIA H100 PCIe", True, False), ("NVIDIA H200", False, True),
    ("NVIDIA H200 NVL", False, True), ("NVIDIA H800", False, False), ("NVIDIA A100-SXM4-80GB", False, False)])
def test_the_class_comes_from_the_name_asked_once(monkeypatch, name, h100, h200):
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: asked.append(index) or name)
    gpu_class.device_name.cache_clear()
    try:
        assert (gpu_class.is_h100(0), gpu_class.is_h200(0)) == (h100, h200)
        assert gpu_class.is_h100(0) is h100 and asked == [0]
    finally:
        gpu_class.device_name.cache_clear()
