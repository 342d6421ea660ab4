"""The online-softmax step every cgtool attention kernel takes per block of keys.

Scores arrive already scaled by log2(e) / sqrt(d), so exp2 stands in for exp. The running
maximum `m_i`, the running sum `l_i` and the unnormalised output `acc` are rescaled by how
far the maximum moved, then the block's weighted values are added.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def online_softmax_step(acc, l_i, m_i, s, v):
    """(acc, l_i, m_i) after one block: `s` [rows, keys] scores, `v` [keys, dim] values."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    l_i = l_i * alpha + tl.sum(p, 1)
    return acc, l_i, m_new
