"""The online softmax every cgtool attention kernel runs over its blocks of keys.

Scores arrive already scaled by log2(e) / sqrt(d), so exp2 stands in for exp. The running
maximum `m_i`, the running sum `l_i` and the unnormalised output `acc` are rescaled by how
far the maximum moved, then the block's weighted values are added.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Scores are computed in base 2: exp2 is a single MUFU instruction, exp is not.
LOG2_E = 1.4426950408889634


@triton.jit
def online_softmax_init(ROWS: tl.constexpr, COLS: tl.constexpr):
    """(acc [ROWS, COLS], l_i [ROWS], m_i [ROWS]) before the first block, all fp32."""
    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, COLS], dtype=tl.float32)
    return acc, l_i, m_i


@triton.jit
def online_softmax_step(acc, l_i, m_i, s, v):
    """(acc, l_i, m_i) after one block: `s` [rows, keys] scores, `v` [keys, dim] values."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    l_i = l_i * alpha + tl.sum(p, 1)
    return acc, l_i, m_new
