"""The largest safe `--mem-fraction-static`: measured, then proven by one more rehearsal.

The KV pool takes `fraction x total` minus the weights, so raising the fraction by d moves
d x total bytes from the free memory into the pool and lowers the rehearsal's headroom by the
same amount (the graphs and the worst eager steps do not depend on the pool's size). The
fraction that would leave the asked headroom follows from one rehearsal's peak; a second
build and rehearsal at that fraction proves it. Only a fraction a rehearsal passed is ever
recommended.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

import torch

from cgtool.units import GIB
from cgtool.verify.result import Proof, Rehearsal
from cgtool.verify.session import Phase, SessionOptions

DEFAULT_HEADROOM_BYTES = 3 * GIB // 2  # free at the worst step: the safety margin
_REMEDY_FRACTION = re.compile(r"to ([0-9.]+) or below")


def tightened_fraction(fraction: float, rehearsal: Rehearsal, headroom_bytes: int) -> float | None:
    """The fraction that leaves `headroom_bytes` at the rehearsal's peak, rounded down to
    SGLang's three decimals (None when the rehearsal says nothing about memory).

    After an out-of-memory failure the peak is unknown: the remedy's fraction (what the failed
    allocation lacked plus 1 GiB) less the headroom is the guess the proof then tests."""
    if rehearsal.status == "ok" and rehearsal.total_bytes > 0:
        spare = rehearsal.headroom_bytes - headroom_bytes
        return _floor3(fraction + spare / rehearsal.total_bytes)
    if rehearsal.status == "oom" and rehearsal.total_bytes > 0:
        match = _REMEDY_FRACTION.search(rehearsal.remedy or "")
        if match is None:
            return None
        return _floor3(float(match.group(1)) - headroom_bytes / rehearsal.total_bytes)
    return None


def recommended_fraction(
    tried: list[tuple[float, Rehearsal]], headroom_bytes: int
) -> tuple[float | None, str | None]:
    """(fraction, note) among the fractions rehearsed: the highest that passed with the asked
    headroom; else the lowest that passed, with a note; None when none passed."""
    passed = [(f, r) for f, r in tried if r.status == "ok"]
    roomy = [f for f, r in passed if r.headroom_bytes >= headroom_bytes]
    if roomy:
        return max(roomy), None
    if passed:
        fraction, rehearsal = min(passed, key=lambda p: p[0])
        return fraction, (
            f"--mem-fraction-static {fraction:g} passed with {rehearsal.headroom_bytes / GIB:.2f} GiB "
            f"free, less than the {headroom_bytes / GIB:.2f} GiB asked (--headroom)"
        )
    return None, "no rehearsed fraction passed: none is recommended"


def kv_tokens_at(kv_tokens: int, fraction: float, other: float, total_bytes: int, token_bytes: int) -> int:
    """KV tokens at fraction `other`, from a pool of `kv_tokens` built at `fraction` on the same
    GPU: SGLang's rule moves (other - fraction) x total bytes into or out of the pool."""
    return max(0, kv_tokens + int((other - fraction) * total_bytes // token_bytes))


def run_proof(opts: SessionOptions, fraction: float, headroom_bytes: int, phase: Phase) -> Proof:
    """A fresh build at `fraction`, the plan's graphs captured, the worst eager steps rehearsed."""
    from cgtool.capture.session import resolve_model
    from cgtool.verify import session as s

    opts = replace(opts, mem_fraction_static=fraction)
    cfg, weights_dir = resolve_model(opts.model, random_weights=False)
    built = s.SessionResult(cfg=cfg)
    phase(f"proof: load {cfg.name} at --mem-fraction-static {fraction:g}")
    try:
        runner = s._build(cfg, weights_dir, opts, built)
    except torch.OutOfMemoryError as exc:
        failed = s._out_of_memory(opts, "loading the model, KV pool and request table", str(exc))
        return Proof(fraction, headroom_bytes, built.kv_tokens, 0, failed)
    phase(f"proof: KV pool {built.kv_tokens:,} tokens")
    measured, runners, oom = s._capture_set(runner, opts.sets[0], opts, strict=True)
    rehearsal = oom or s._rehearse(runner, opts)
    del runners, runner
    phase(f"proof: rehearsal {rehearsal.status}, headroom {rehearsal.headroom_bytes / GIB:.2f} GiB, "
          f"graphs {measured.graph_bytes / GIB:.2f} GiB")
    return Proof(fraction, headroom_bytes, built.kv_tokens, measured.graph_bytes, rehearsal)


def _floor3(value: float) -> float:
    # A hair of float error (0.8999999) must not cost a whole step of 0.001.
    return math.floor(value * 1000 + 1e-6) / 1000
