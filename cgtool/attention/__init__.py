"""Attention: one custom op (the piecewise split point) and its backends."""

from cgtool.attention.op import ATTENTION_OP, make_backend

__all__ = ["ATTENTION_OP", "make_backend"]
