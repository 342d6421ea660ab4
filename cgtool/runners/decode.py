"""Decode graphs: one CUDA graph per batch size, replayed by padding to the next captured size."""

from __future__ import annotations

import bisect
from functools import partial

import torch

from cgtool.runners.graphs import warm_and_record
from cgtool.runners.pitfalls import StaticInputs
from cgtool.runners.pool import SizeStep, freeze_gc, just_record
from cgtool.runners.sizes import capture_sizes
from cgtool.runtime.batch import ForwardBatch, ForwardMode, forward_context
from cgtool.runtime.engine import ModelRunner
from cgtool.runtime.kv import DUMMY_REQ, DUMMY_SLOT
from cgtool.specs.hidden_states import HiddenMode, decode_hidden_rows


class DecodeGraphRunner:
    def __init__(
        self,
        model_runner: ModelRunner,
        capture_bs: list[int],
        enable_cudagraph_gc: bool = False,
        seq_len_fill_value: int = 1,
        hidden_mode: HiddenMode = HiddenMode.NULL,
    ) -> None:
        self.model_runner = model_runner
        self.capture_bs = capture_sizes(capture_bs)
        self.max_bs = self.capture_bs[-1]
        self.enable_cudagraph_gc = enable_cudagraph_gc
        self.seq_len_fill_value = seq_len_fill_value
        vocab = model_runner.model.cfg.vocab_size
        with torch.device(model_runner.device):
            self.input_ids = torch.zeros((self.max_bs,), dtype=torch.int64)
            self.positions = torch.zeros((self.max_bs,), dtype=torch.int64)
            self.req_pool_indices = torch.full((self.max_bs,), DUMMY_REQ, dtype=torch.int64)
            self.seq_lens = torch.full((self.max_bs,), seq_len_fill_value, dtype=torch.int32)
            self.out_cache_loc = torch.full((self.max_bs,), DUMMY_SLOT, dtype=torch.int64)
            self.logits = torch.zeros((self.max_bs, vocab), dtype=torch.float32)  # [max_bs, vocab]
        self.hidden_mode = HiddenMode.NULL
        self.hidden_states: torch.Tensor | None = None  # [max_bs, hidden] from LAST up
        self._allocate_hidden(hidden_mode)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}  # kept alive: they share one pool
        self.kernel_nodes: dict[int, int | None] = {}
        # Graphs of a lower mode, replaced by a recapture: kept alive too, since freeing a graph
        # of the shared pool while capturing into it fails inside PyTorch's allocator.
        self.retired_graphs: list[torch.cuda.CUDAGraph] = []
        self.stream = torch.cuda.Stream() if torch.cuda.is_available() else None
        self.replay_count = 0

    @property
    def static_buffer_bytes(self) -> int:
        """Inputs and outputs the graphs read and write in place, allocated outside the pool."""
        return sum(t.numel() * t.element_size() for t in self._buffers().values())

    def _buffers(self) -> dict[str, torch.Tensor]:
        buffers = {
            "input_ids": self.input_ids, "positions": self.positions,
            "req_pool_indices": self.req_pool_indices, "seq_lens": self.seq_lens,
            "out_cache_loc": self.out_cache_loc, "logits": self.logits,
        }
        if self.hidden_states is not None:
            buffers["hidden_states"] = self.hidden_states
        return buffers

    def _allocate_hidden(self, mode: HiddenMode) -> None:
        """The mode's static output, allocated once at max_bs (LAST and FULL share it: a
        decode request has one token); the addresses replay checks follow the buffers."""
        rows = decode_hidden_rows(mode, self.max_bs)
        if rows and self.hidden_states is None:
            model = self.model_runner.model
            self.hidden_states = torch.zeros(
                (rows, model.cfg.hidden_size), dtype=_model_dtype(model), device=self.model_runner.device
            )
        self.hidden_mode = mode
        self.static_inputs = StaticInputs(**self._buffers())

    @property
    def captured_bs(self) -> list[int]:
        return sorted(self.graphs)

    def static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            seq_lens_cpu=[],  # a captured graph must not depend on host values
        )

    def _forward_into_logits(self, batch: ForwardBatch) -> None:
        runner, bs = self.model_runner, batch.batch_size
        with forward_context(batch, runner.kv_pool, runner.backend):
            hidden = runner.model(batch.input_ids, batch.positions)
        runner.model.compute_logits(hidden, out=self.logits[:bs])
        if self.hidden_mode is not HiddenMode.NULL:
            self.hidden_states[: decode_hidden_rows(self.hidden_mode, bs)].copy_(hidden)

    def forward_static(self, bs: int) -> None:
        """What capture records, run eagerly: for diagnosing a capture that failed."""
        self._forward_into_logits(self.static_batch(bs))

    def capture(self, step: SizeStep = just_record) -> None:
        """Record one graph per batch size into the global pool, as nano-vllm's capture loop.

        Largest first, as SGLang does: the smaller graphs reuse the pool memory the largest
        one took. GC is collected once and frozen for the whole loop (`freeze_gc` says why).
        `step` runs around each size (progress, barrier, measuring, out-of-memory policy).
        """
        with freeze_gc(self.enable_cudagraph_gc):
            for index, bs in enumerate(reversed(self.capture_bs)):
                if not step(index, bs, partial(self._record, bs)):
                    break

    def recapture(self, mode: HiddenMode, step: SizeStep = just_record) -> None:
        """Capture every size again at a higher mode, as the runtime does when a request needs
        more hidden state than the graphs return; a lower or equal mode is refused."""
        if mode <= self.hidden_mode:
            raise ValueError(f"recapture goes upward only: {self.hidden_mode.name} to {mode.name}")
        self.retired_graphs.extend(self.graphs.values())
        self.graphs = {}
        self._allocate_hidden(mode)
        self.capture(step)

    def _record(self, bs: int) -> None:
        batch = self.static_batch(bs)
        recorded = warm_and_record(partial(self._forward_into_logits, batch), self.stream)
        self.graphs[bs] = recorded.graph
        self.kernel_nodes[bs] = recorded.kernels

    def drop_size(self, bs: int) -> None:
        """Never replay `bs` (with TP, a peer failed to record it): its graph is retired, alive."""
        graph = self.graphs.pop(bs, None)
        if graph is not None:
            self.retired_graphs.append(graph)
        self.kernel_nodes.pop(bs, None)

    def graph_kernels(self, bs: int) -> int | None:
        """Kernels one replay of `bs`'s graph launches, read from the graph at capture."""
        return self.kernel_nodes.get(bs)

    def can_run(self, batch: ForwardBatch) -> bool:
        return (
            batch.forward_mode.is_decode()
            and bool(self.graphs)
            and batch.batch_size <= self.captured_bs[-1]
        )

    def load_inputs(self, batch: ForwardBatch) -> int:
        """Copy the batch into the static buffers; returns the captured size it pads up to."""
        raw_bs = batch.batch_size
        captured = self.captured_bs or self.capture_bs
        bs = captured[bisect.bisect_left(captured, raw_bs)]
        if bs != raw_bs:
            # Padded entries read request row 0 and write slot 0: both reserved dummies.
            self.seq_lens.fill_(self.seq_len_fill_value)
            self.out_cache_loc.fill_(DUMMY_SLOT)
            self.req_pool_indices.fill_(DUMMY_REQ)
        self.input_ids[:raw_bs].copy_(batch.input_ids)
        self.positions[:raw_bs].copy_(batch.positions)
        self.req_pool_indices[:raw_bs].copy_(batch.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(batch.seq_lens)
        self.out_cache_loc[:raw_bs].copy_(batch.out_cache_loc)
        return bs

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits of the batch's requests, [raw_bs, vocab], from the next captured size up."""
        return self.replay_outputs(batch)[0]

    def replay_outputs(self, batch: ForwardBatch) -> list[torch.Tensor]:
        """The mode's outputs of the batch's requests: [logits] at NULL, [logits, hidden
        states [raw_bs, hidden]] from LAST up; views of the static buffers, sliced."""
        self.static_inputs.check(**self._buffers())
        bs = self.load_inputs(batch)
        self.graphs[bs].replay()
        self.replay_count += 1
        return self._outputs(self.logits, self.hidden_states, batch.batch_size)

    def eager_outputs(self, batch: ForwardBatch) -> list[torch.Tensor]:
        """What `replay_outputs` returns, computed without graphs: the oracle replay is checked by."""
        hidden = self.model_runner.forward_eager(batch)
        logits = self.model_runner.model.compute_logits(hidden)
        return self._outputs(logits, hidden, batch.batch_size)

    def _outputs(self, logits: torch.Tensor, hidden: torch.Tensor | None, bs: int) -> list[torch.Tensor]:
        if self.hidden_mode is HiddenMode.NULL:
            return [logits[:bs]]
        return [logits[:bs], hidden[: decode_hidden_rows(self.hidden_mode, bs)]]

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if self.can_run(batch):
            return self.replay(batch)
        runner = self.model_runner
        return runner.model.compute_logits(runner.forward_eager(batch))


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype the final hidden state comes out in: the weights' (a bare stand-in has none)."""
    parameter = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return torch.get_default_dtype() if parameter is None else parameter.dtype
