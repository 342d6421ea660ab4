"""Per-step modules go straight to forward, in eager code and under dynamo."""

from __future__ import annotations

import torch
from torch import nn

from cgtool.model.direct_call import DirectCall
from cgtool.model.layers import RMSNorm, SwiGLU


class Doubler(DirectCall, nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x


def test_a_direct_call_skips_nn_modules_call_machinery(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("nn.Module.__call__ ran")

    monkeypatch.setattr(nn.Module, "_call_impl", refuse)
    x = torch.randn(3, 8)
    assert torch.equal(Doubler()(x), 2 * x)
    norm, mlp = RMSNorm(8, 1e-6), SwiGLU(8, 16)
    assert torch.equal(norm(x), norm.forward(x)) and torch.equal(mlp(x), mlp.forward(x))


def test_dynamo_traces_direct_calls_into_one_graph():
    model = nn.Sequential(Doubler(), RMSNorm(8, 1e-6), SwiGLU(8, 16))  # Sequential calls them
    x = torch.randn(3, 8)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), model(x))
