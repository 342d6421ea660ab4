"""SGLang's hidden-state capture modes (CaptureHiddenMode): what a decode graph returns beside
the logits, and the static output buffer each mode needs. Torch-free: the planner uses it."""

from __future__ import annotations

from enum import IntEnum
from itertools import pairwise

from cgtool.errors import InputError


class HiddenMode(IntEnum):
    """Ordered as the runtime upgrades them: it recaptures upward and never downgrades."""

    NULL = 0  # logits only
    LAST = 1  # plus each request's last token's final hidden state
    FULL = 2  # plus every token's final hidden state

    @property
    def flag(self) -> str:
        return self.name.lower()


def parse_hidden_modes(text: str, flag: str = "--hidden-states") -> tuple[HiddenMode, ...]:
    """`null,full` into modes in capture order; each must be above the one before it."""
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    remedy = f"Write {flag} null, last or full, or an upward list such as null,full."
    modes = []
    for name in names:
        if name.upper() not in HiddenMode.__members__:
            raise InputError(f"{flag} '{name}' is not a hidden-state mode", remedy)
        modes.append(HiddenMode[name.upper()])
    if not modes:
        raise InputError(f"{flag} '{text}' names no mode", remedy)
    if any(b <= a for a, b in pairwise(modes)):
        raise InputError(
            f"{flag} '{text}' goes down or repeats: the runtime only recaptures upward", remedy
        )
    return tuple(modes)


def decode_hidden_rows(mode: HiddenMode, bs: int) -> int:
    """Rows of final hidden state a decode graph of `bs` requests returns. A decode request
    has one token, so its last token is all its tokens: LAST and FULL return the same rows
    (they differ on extend batches and speculative verify, which decode graphs here do not run)."""
    return 0 if mode is HiddenMode.NULL else bs


def decode_hidden_buffer_bytes(mode: HiddenMode, max_bs: int, hidden_size: int, dtype_bytes: int) -> int:
    """The static hidden-state output a decode runner allocates once at its largest size."""
    return decode_hidden_rows(mode, max_bs) * hidden_size * dtype_bytes
