"""What a plan says about itself: the basis of its figures and the notes on its server."""

from __future__ import annotations

from cgtool.documents.plan_document import EagerAssumption, PlanBasis
from cgtool.planner.grid import MIN_BIN_SHARE
from cgtool.planner.request import PlanRequest
from cgtool.planner.robust import RobustChoice, Scenario
from cgtool.planner.scenarios import HELD_OUT_SPLIT
from cgtool.planner.schedules import EngineSchedule
from cgtool.planner.scoring import Histogram
from cgtool.planner.server import Server


def decode_part(sizes: list[int], cover: int) -> list[int]:
    """Sizes up to the first at or above `cover`: a shared list's decode graphs."""
    above = [s for s in sizes if s >= cover]
    return [s for s in sizes if s < cover] + above[:1]


def plan_basis(
    server: Server,
    choice: RobustChoice,
    fit: list[Scenario],
    held: list[Scenario],
    replicas: int,
    req: PlanRequest,
) -> PlanBasis:
    held_steps = sum(int(sc.decode.counts.sum() + sc.extend.counts.sum()) for sc in held)
    checked = "held-out" if held_steps else "in-sample (nothing was held out)"
    source = server.cost.source
    return PlanBasis(
        statement=(
            f"Step times and gains are predictions of the {source} cost model, not "
            f"measurements; sizes hold up across the eager-cost assumptions below and are "
            f"scored {checked} on the last {1 - HELD_OUT_SPLIT:.0%} of the requests by arrival"
            if held_steps
            else f"Step times and gains are predictions of the {source} cost model, "
            "not measurements, scored on the steps they were fitted on (no held-out check)"
        ),
        cost_model=source,
        eager_assumptions=[EagerAssumption(a.name, a.basis) for a in server.assumptions],
        held_out_share=1 - HELD_OUT_SPLIT if held_steps else 0.0,
        fit_steps=sum(int(sc.decode.counts.sum() + sc.extend.counts.sum()) for sc in fit),
        held_out_steps=held_steps,
        max_bs_reason=choice.max_bs_reason,
        largest_batch_fitted=choice.reached,
        worst_regret=choice.worst_regret,
        token_grid="multiples of 16 up to 1024 tokens, of 64 above",
        min_bin_share=MIN_BIN_SHARE,
        replicas=replicas,
        replicas_asked=req.replicas,
    )


def replication_warnings(req: PlanRequest) -> list[str]:
    kv, tp = req.cfg.num_kv_heads, req.tp_size
    if kv >= tp:
        return []
    return [
        (
            f"--tp {tp} is more ranks than {req.cfg.name}'s {kv} KV heads: each is replicated on "
            f"{tp // kv} ranks, so KV memory per token stops shrinking past --tp {kv}"
        )
    ]


def ceiling_warnings(decode: Histogram, default: EngineSchedule) -> list[str]:
    above = (decode.sizes > default.max_bs) & (decode.counts > 0)
    if not above.any():
        return []
    eager, total = int(decode.counts[above].sum()), int(decode.counts.sum())
    return [
        (
            f"the default's largest decode graph ({default.max_bs}) is below batches the trace "
            f"reaches (up to {int(decode.sizes[above].max())}): {eager:,} of {total:,} decode "
            f"steps ({share_text(eager, total)}) would run eagerly"
        )
    ]


def share_text(part: int, whole: int) -> str:
    """A share that never reads 0% while `part` is some, nor 100% while it is not all."""
    share = part / max(whole, 1)
    if 0 < share < 0.001:
        return "under 0.1%"
    if part < whole and share > 0.999:
        return "over 99.9%"
    return f"{share:.1%}"


# Below this many requests a plan rests on too few to say more than what they did: a held-out
# score of a few dozen requests moves with each one (three requests once gave a plan 1.23x
# slower held out than the default, its one held-out prompt past the fitted ceiling).
FEW_REQUESTS = 100


def few_requests_warning(num_requests: int) -> str | None:
    """A caution for plans from a handful of requests."""
    if num_requests >= FEW_REQUESTS:
        return None
    return (
        f"only {num_requests} request{'s' if num_requests != 1 else ''}: with fewer than "
        f"{FEW_REQUESTS} the sizes and their held-out check rest on a handful, so the plan is a "
        "guess, not evidence. Plan from a larger sample of the workload"
    )
