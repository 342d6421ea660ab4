"""A counting stand-in for the attention op, as in vLLM's piecewise tests: mutates `out`."""

import torch
from torch import nn

calls = 0


@torch.library.custom_op("cgtool_test::silly_attention", mutates_args=("out",))
def silly_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    global calls
    calls += 1
    out.copy_(q + 2 * k + v)


@silly_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    return None


SILLY_OP = torch.ops.cgtool_test.silly_attention.default


class SillyModel(nn.Module):
    """vLLM's test_simple toy: two attention calls, three capturable pieces around them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + 1
        x = x * 2
        out = torch.empty_like(x)
        torch.ops.cgtool_test.silly_attention(x, x, x, out)
        x = out - 2
        x = x * 3
        out = torch.empty_like(x)
        torch.ops.cgtool_test.silly_attention(x, x, x, out)
        return out + 1
