"""Piecewise graphs: the decoder body compiled and split at attention, graphs per token count.

Extend batches are padded to the next captured token count; the capturable pieces replay
their graphs and attention runs eagerly between them with the batch's real metadata, so
one graph per token count serves any mix of requests and cached prefixes.
"""

from __future__ import annotations

import bisect
import dataclasses
from pathlib import Path

import torch

from cgtool.documents.results import CompileCacheStatus
from cgtool.runners import compile_cache
from cgtool.runners.piecewise_backend import CapturablePiece, PiecewiseBackend, use_graphs_for
from cgtool.runners.pool import model_capture_mode
from cgtool.runners.prefill_inputs import PrefillStaticTokens
from cgtool.runners.sizes import capture_sizes
from cgtool.runtime.batch import ForwardBatch, forward_context
from cgtool.runtime.distributed import current_tp
from cgtool.runtime.engine import ModelRunner
from cgtool.runtime.kv import DUMMY_SLOT


class PiecewiseGraphRunner(PrefillStaticTokens):
    def __init__(
        self,
        model_runner: ModelRunner,
        capture_num_tokens: list[int],
        compiler: str = "eager",
        enable_cudagraph_gc: bool = False,
        compile_cache_dir: Path | None = None,
    ) -> None:
        self.model_runner = model_runner
        self.capture_num_tokens = capture_sizes(capture_num_tokens)
        self.max_num_tokens = self.capture_num_tokens[-1]
        self.enable_cudagraph_gc = enable_cudagraph_gc
        self._allocate_static_tokens()
        self.backend = PiecewiseBackend(compiler)
        # Inductor's pieces are no plain code to store; it keeps a disk cache of its own.
        self.cache_dir = compile_cache_dir if compiler == "eager" else None
        self.compile_cache: CompileCacheStatus = "off"
        self.cache_key = ""
        self.not_stored_reason: str | None = None
        self.compiled_body = self._cached_body() or torch.compile(
            model_runner.model.model, backend=self.backend, fullgraph=True
        )
        self.captured_num_tokens: list[int] = []
        self.stream = torch.cuda.Stream() if torch.cuda.is_available() else None
        self.replay_count = 0
        self.warmed_up = False

    def forward_static(self, num_tokens: int) -> None:
        """What capture records, run without graphs: for diagnosing a capture that failed."""
        self.forward_compiled(self.static_batch(num_tokens))

    def forward_compiled(self, batch: ForwardBatch) -> torch.Tensor:
        """The compiled, split body; its pieces use graphs only inside `use_graphs_for`."""
        runner = self.model_runner
        with forward_context(batch, runner.kv_pool, runner.backend):
            return self.compiled_body(batch.input_ids, batch.positions)

    def _cached_body(self) -> compile_cache.LoadedBody | None:
        """The body from the compile cache: its pieces join the backend's, dynamo never runs."""
        if self.cache_dir is None:
            return None
        runner, tp = self.model_runner, current_tp()
        try:
            self.cache_key = compile_cache.cache_key(
                runner.model.model, runner.model.cfg.config_hash(), self.backend.compiler, tp.rank, tp.size
            )
        except OSError:  # cgtool's source unreadable: no key to trust
            self.cache_dir = None
            return None
        body = compile_cache.try_load(self.cache_dir, self.cache_key, runner.model.model, CapturablePiece)
        self.compile_cache = "miss" if body is None else "hit"
        if body is not None:
            self.backend.pieces.extend(body.capturable)
        return body

    def warmup(self) -> None:
        """Compile the body for a dynamic token count (or load it) and run it once, without graphs."""
        batch = self.static_batch(self.max_num_tokens)
        if self.compile_cache != "hit":
            # Marked dynamic, so the one compilation serves every token count.
            torch._dynamo.mark_dynamic(batch.input_ids, 0)
            torch._dynamo.mark_dynamic(batch.positions, 0)
        hidden = self.forward_compiled(batch)
        if self.compile_cache == "miss" and self.cache_dir is not None:
            self.not_stored_reason = compile_cache.try_store(
                self.cache_dir, self.cache_key, self.backend, self.model_runner.model.model,
                (batch.input_ids, batch.positions), hidden,
            )
            self.compile_cache = "miss" if self.not_stored_reason is None else "not_stored"
        self.warmed_up = True

    def _record(self, num_tokens: int) -> None:
        """Each piece warms up and records its graph as the compiled body reaches it."""
        batch = self.static_batch(num_tokens)
        with model_capture_mode(), torch.cuda.stream(self.stream), use_graphs_for(num_tokens):
            self.forward_compiled(batch)
        torch.cuda.current_stream().wait_stream(self.stream)
        if not any(num_tokens in piece.graphs for piece in self.backend.pieces):
            # e.g. dynamo hit its recompile limit and ran the body eagerly, without our backend
            raise RuntimeError(f"no piece recorded a CUDA graph for {num_tokens} tokens")
        bisect.insort(self.captured_num_tokens, num_tokens)

    def graph_kernels(self, num_tokens: int) -> int | None:
        """Kernels the pieces' graphs for `num_tokens` launch in one replay, read from the
        graphs at capture; the attention between them runs eagerly and is not included."""
        counts = [p.kernel_nodes[num_tokens] for p in self.backend.pieces if num_tokens in p.kernel_nodes]
        if not counts or None in counts:
            return None
        return sum(counts)  # type: ignore[arg-type]

    def can_run(self, batch: ForwardBatch) -> bool:
        return (
            batch.forward_mode.is_extend()
            and bool(self.captured_num_tokens)
            and batch.num_tokens <= self.captured_num_tokens[-1]
            and not batch.needs_input_logprobs()
        )

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states [num_real_tokens, hidden] from the next captured token count up.

        The result lives in the graph pool: read it before the next replay.
        """
        self.static_inputs.check(**self._buffers())
        raw = batch.num_tokens
        captured = self.captured_num_tokens
        num_tokens = captured[bisect.bisect_left(captured, raw)]
        self.input_ids[:raw].copy_(batch.input_ids)
        self.positions[:raw].copy_(batch.positions)
        self.out_cache_loc[:raw].copy_(batch.out_cache_loc)
        # Padded tokens keep stale ids and positions (valid indices) and write the dummy slot.
        self.out_cache_loc[raw:num_tokens].fill_(DUMMY_SLOT)
        static = dataclasses.replace(
            batch,
            input_ids=self.input_ids[:num_tokens],
            positions=self.positions[:num_tokens],
            out_cache_loc=self.out_cache_loc[:num_tokens],
        )
        with use_graphs_for(num_tokens):
            hidden = self.forward_compiled(static)
        self.replay_count += 1
        return hidden[: batch.num_real_tokens]

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if self.can_run(batch):
            return self.replay(batch)
        return self.model_runner.forward_eager(batch)
