"""A schedule chosen and its memory sized: shared by plans from requests and from batches."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from cgtool.documents.plan_document import PlanMemory
from cgtool.planner.eager import EagerAssumption
from cgtool.planner.engine_buffers import engine_graph_buffers
from cgtool.planner.memory import plan_memory
from cgtool.planner.optimiser import Limits
from cgtool.planner.releases import release_rules, through_chunk
from cgtool.planner.request import PlanRequest
from cgtool.planner.robust import RobustChoice, Scenario, choose_robust
from cgtool.planner.server import Server


def memory_for(
    req: PlanRequest,
    server: Server,
    decode_bs: list[int] | tuple[int, ...],
    tokens: list[int] | tuple[int, ...],
    peak_kv: int,
    typical: int,
) -> PlanMemory:
    """plan_memory for these graphs on this server (peak KV demand and typical request size
    in tokens)."""
    memory = plan_memory(
        req.cfg,
        req.gpu.memory_bytes,
        graph_bytes=server.cost.graph_bytes(decode_bs, tokens),
        chunked_prefill_size=server.chunk,
        max_running_requests=server.max_running,
        peak_kv_demand_tokens=peak_kv,
        typical_request_tokens=typical,
        default_mem_fraction_static=server.default_fraction,
        tp_size=req.tp_size,
    )
    # The engine's pool as the comparison scores it: vLLM's from its own bytes, not from the
    # fraction rounded to 3 decimals (453,342 tokens, against 453,600 beside it; issue 34).
    memory.default_kv_tokens = server.default_kv_tokens
    return memory


def limits_for(req: PlanRequest, server: Server) -> Limits:
    return Limits(
        server.max_running,
        min(server.chunk, server.context_len),
        req.budget_graphs,
        req.budget_memory_bytes,
    )


def choose_and_size(
    req: PlanRequest, server: Server, fit: list[Scenario], peak_kv: int, typical: int
) -> tuple[RobustChoice, PlanMemory, list[str]]:
    """Sizes, their memory plan, and a note where the release's own rule changed them."""
    rules = release_rules(req.engine, server.version)
    limits = given = limits_for(req, server)
    assumptions = list(server.assumptions)
    top = limits.max_tokens  # the chunk, or the context where that is shorter
    if rules.capture_through_chunk:
        assumptions = [_padded_to_chunk(a, top) for a in assumptions]
        if limits.budget_graphs is not None:
            limits = replace(limits, budget_graphs=max(limits.budget_graphs - 1, 0))
    choice = choose_robust(fit, assumptions, server.default, limits, req.engine)
    if not rules.capture_through_chunk:
        return choice, size_memory(req, server, choice, peak_kv, typical), []
    # SGLang 0.5.23 captures prefill graphs through the chunk (releases.through_chunk): the
    # plan holds that size itself, so plan.json, its memory plan and its flags agree.
    tokens, note = through_chunk(rules, tuple(choice.tokens) or (top,), top)
    if not _within(given, server, choice.decode_bs, tokens):
        tokens, note = (), (f"no prefill graphs: {rules.engine} {rules.version}'s must reach "
                            f"{top} tokens, which the budgets given cannot hold")
    choice.tokens = list(tokens)
    return choice, size_memory(req, server, choice, peak_kv, typical), [note] if note else []


def _within(limits: Limits, server: Server, decode_bs: list[int], tokens: tuple[int, ...]) -> bool:
    graphs, memory = limits.budget_graphs, limits.budget_memory_bytes
    return (graphs is None or len(decode_bs) + len(tokens) <= graphs) and (
        memory is None or server.cost.graph_bytes(decode_bs, tokens) <= memory)


def _padded_to_chunk(a: EagerAssumption, chunk: int) -> EagerAssumption:
    """With a graph at the chunk always captured, a prefill step above the chosen sizes pads
    to it rather than running eagerly: the sizes are chosen at that price."""
    extend_eager = np.full_like(a.cost.extend_eager_ms, a.cost.extend_graph_ms[chunk])
    return replace(a, cost=replace(a.cost, extend_eager_ms=extend_eager))


def size_memory(
    req: PlanRequest, server: Server, choice: RobustChoice, peak_kv: int, typical: int
) -> PlanMemory:
    """The memory plan of these sizes, with the engine's graph buffers where it has them."""
    memory = memory_for(req, server, choice.decode_bs, choice.tokens, peak_kv, typical)
    if server.attention_backend is not None:
        ours, default = (
            engine_graph_buffers(
                req.cfg, server.attention_backend, max(sizes, default=0), server.context_len,
                req.gpu, server.version, req.tp_size,
            )
            for sizes in (choice.decode_bs, server.default.decode_bs)
        )
        memory.attention_backend = server.attention_backend
        memory.attention_buffer_bytes, memory.static_input_bytes = ours.attention_bytes, ours.static_input_bytes
        memory.default_attention_buffer_bytes = default.attention_bytes
        memory.default_static_input_bytes = default.static_input_bytes
    return memory
