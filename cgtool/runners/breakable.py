"""Breakable prefill graphs: the eager body recorded in segments broken at attention.

SGLang's default prefill graphs on CUDA since its per-phase graph config (0.5.23
model_executor/cuda_graph_config.py `default_prefill_backend`): no torch.compile, no FX split.
The body runs eagerly while a CUDA graph records; where a layer calls the attention backend,
the graph being recorded ends, attention runs eagerly (its grid is sized from the batch's host
lengths, which no graph could hold), and the next segment begins. A layer of L attention calls
gives L + 1 segments per token count, all in the one shared pool.

Replay runs the segments in the order they were recorded and calls the backend between them
with the batch's real metadata, on the q and output buffers the segments read and write in the
pool. Those buffers are kept as weak references, as piecewise outputs are: replaying in capture
order rewrites each before it is read, so their memory goes back to the pool for later segments.

`SegmentRecorder` and `SegmentedGraph` know nothing of CUDA: a segment is anything with
begin/end/replay, so the splitting is tested on the CPU with a stand-in segment.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import torch

from cgtool.runners.graphs import count_kernel_nodes
from cgtool.runners.piecewise_backend import weak_ref_tensor
from cgtool.runners.pool import (
    get_global_graph_memory_pool,
    model_capture_mode,
)
from cgtool.runners.prefill_inputs import PrefillStaticTokens
from cgtool.runners.sizes import capture_sizes
from cgtool.runtime.batch import ForwardBatch, forward_context
from cgtool.runtime.engine import ModelRunner
from cgtool.runtime.kv import DUMMY_SLOT, KVPool


class Segment(Protocol):
    def begin(self) -> None: ...
    def end(self) -> None: ...
    def replay(self) -> None: ...


@dataclass(frozen=True, slots=True)
class AttentionBreak:
    """One eager attention call between two segments: the buffers it reads and writes."""

    q: torch.Tensor  # [num_tokens, heads * head_dim], written by the segment before
    out: torch.Tensor  # [num_tokens, heads * head_dim], read by the segment after
    layer_id: int


@dataclass
class SegmentedGraph:
    """One token count's graphs: len(segments) == len(breaks) + 1."""

    segments: list[Segment]
    breaks: list[AttentionBreak]
    output: Any = None

    def replay(self, attend: Callable[[AttentionBreak], None]) -> Any:
        for segment, between in zip(self.segments, self.breaks, strict=False):
            segment.replay()
            attend(between)
        self.segments[-1].replay()
        return self.output


@dataclass
class SegmentRecorder:
    """Cuts one recording into segments at each `break_at`; `new_segment` makes the next one."""

    new_segment: Callable[[], Segment]
    keep: Callable[[torch.Tensor], torch.Tensor] = lambda t: t  # weak references on the GPU
    segments: list[Segment] = field(default_factory=list)
    breaks: list[AttentionBreak] = field(default_factory=list)
    _open: Segment | None = None

    def start(self) -> None:
        self._open = self.new_segment()
        self._open.begin()

    def break_at(self, q: torch.Tensor, out: torch.Tensor, layer_id: int, run: Callable[[], None]) -> None:
        self._close()
        run()  # eager, outside any graph: it writes `out` for the next segment to read
        self.breaks.append(AttentionBreak(self.keep(q), self.keep(out), layer_id))
        self.start()

    def finish(self, output: Any) -> SegmentedGraph:
        self._close()
        return SegmentedGraph(self.segments, self.breaks, output)

    def _close(self) -> None:
        if self._open is None:
            raise RuntimeError("segment recorder: no segment is open")
        self._open.end()
        self.segments.append(self._open)
        self._open = None


class BreakingBackend:
    """The attention backend seen by the model while a size records: every call is a break."""

    def __init__(self, backend: Any, recorder: SegmentRecorder) -> None:
        self.inner = backend
        self.recorder = recorder
        self.name = getattr(backend, "name", "attention")

    def forward(self, q: torch.Tensor, out: torch.Tensor, layer_id: int, batch: ForwardBatch, kv_pool: KVPool) -> None:
        run = partial(self.inner.forward, q, out, layer_id, batch, kv_pool)
        self.recorder.break_at(q, out, layer_id, run)

    def forward_projected(self, q: torch.Tensor, w_uv: torch.Tensor, out: torch.Tensor, layer_id: int,
                          batch: ForwardBatch, kv_pool: KVPool) -> bool:
        """Never: an attention call is a break, and a break runs `forward` alone."""
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CudaSegment:
    """One CUDA graph of a segment, recorded on the current (capture) stream into the pool."""

    def __init__(self) -> None:
        try:
            self.graph = torch.cuda.CUDAGraph(keep_graph=True)
        except TypeError:  # a torch without keep_graph: no kernel count
            self.graph = torch.cuda.CUDAGraph()
        self.kernels: int | None = None

    def begin(self) -> None:
        self.graph.capture_begin(pool=get_global_graph_memory_pool())

    def end(self) -> None:
        self.graph.capture_end()
        try:
            raw = self.graph.raw_cuda_graph()
        except (AttributeError, RuntimeError):
            return
        self.kernels = count_kernel_nodes(raw)
        self.graph.instantiate()

    def replay(self) -> None:
        self.graph.replay()


class BreakableGraphRunner(PrefillStaticTokens):
    """Prefill graphs per token count without torch.compile (SGLang's BCG backend)."""

    compile_cache = "off"  # nothing is compiled

    def __init__(
        self, model_runner: ModelRunner, capture_num_tokens: list[int], enable_cudagraph_gc: bool = False
    ) -> None:
        self.model_runner = model_runner
        self.capture_num_tokens = capture_sizes(capture_num_tokens)
        self.max_num_tokens = self.capture_num_tokens[-1]
        self.enable_cudagraph_gc = enable_cudagraph_gc
        self._allocate_static_tokens()
        self.graphs: dict[int, SegmentedGraph] = {}  # kept alive: they share one pool
        self.captured_num_tokens: list[int] = []
        self.stream = torch.cuda.Stream() if torch.cuda.is_available() else None
        self.replay_count = 0
        self.warmed_up = False

    def forward_static(self, num_tokens: int) -> None:
        """What a capture records, run without graphs: for diagnosing a capture that failed."""
        self._body(self.static_batch(num_tokens), self.model_runner.backend)

    def _body(self, batch: ForwardBatch, backend: Any) -> torch.Tensor:
        runner = self.model_runner
        with forward_context(batch, runner.kv_pool, backend):
            return runner.model.model(batch.input_ids, batch.positions)

    def warmup(self) -> None:
        """One eager forward at the largest size: Triton's JIT and cuBLAS's workspaces are
        set up outside any graph (there is nothing to compile)."""
        self.forward_static(self.max_num_tokens)
        self.warmed_up = True

    def _record(self, num_tokens: int) -> None:
        batch = self.static_batch(num_tokens)
        recorder = SegmentRecorder(CudaSegment, keep=weak_ref_tensor)
        breaking = BreakingBackend(self.model_runner.backend, recorder)
        assert self.stream is not None
        with model_capture_mode(), torch.cuda.stream(self.stream):
            self._body(batch, self.model_runner.backend)  # warm-up at this size, outside graphs
            self.stream.synchronize()
            with _keep_segments_if_failed(recorder):
                recorder.start()
                hidden = self._body(batch, breaking)
                graph = recorder.finish(None)
            graph.output = weak_ref_tensor(hidden)  # made outside capture: it reads the pointer
        torch.cuda.current_stream().wait_stream(self.stream)
        self.graphs[num_tokens] = graph
        bisect.insort(self.captured_num_tokens, num_tokens)

    def graph_kernels(self, num_tokens: int) -> int | None:
        """Kernels the segments launch in one replay; the attention between them is eager."""
        graph = self.graphs.get(num_tokens)
        if graph is None:
            return None
        counts = [getattr(s, "kernels", None) for s in graph.segments]
        return None if None in counts else sum(counts)  # type: ignore[arg-type]

    def num_segments(self, num_tokens: int) -> int:
        return len(self.graphs[num_tokens].segments)

    def can_run(self, batch: ForwardBatch) -> bool:
        return (
            batch.forward_mode.is_extend()
            and bool(self.captured_num_tokens)
            and batch.num_tokens <= self.captured_num_tokens[-1]
            and not batch.needs_input_logprobs()
        )

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states [num_real_tokens, hidden], read before the next replay (they live in
        the pool)."""
        self.static_inputs.check(**self._buffers())
        raw = batch.num_tokens
        captured = self.captured_num_tokens
        num_tokens = captured[bisect.bisect_left(captured, raw)]
        self.input_ids[:raw].copy_(batch.input_ids)
        self.positions[:raw].copy_(batch.positions)
        self.out_cache_loc[:raw].copy_(batch.out_cache_loc)
        self.out_cache_loc[raw:num_tokens].fill_(DUMMY_SLOT)  # padded tokens write the dummy slot
        static = dataclasses.replace(
            batch,
            input_ids=self.input_ids[:num_tokens],
            positions=self.positions[:num_tokens],
            out_cache_loc=self.out_cache_loc[:num_tokens],
        )
        runner = self.model_runner
        hidden = self.graphs[num_tokens].replay(
            lambda b: runner.backend.forward(b.q, b.out, b.layer_id, static, runner.kv_pool)
        )
        self.replay_count += 1
        return hidden[: batch.num_real_tokens]

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if self.can_run(batch):
            return self.replay(batch)
        return self.model_runner.forward_eager(batch)


# Segments of a size whose capture raised: kept, not freed, since freeing a graph while the
# shared pool still takes captures trips an assertion in PyTorch's allocator.
_failed_segments: list[Segment] = []


@contextmanager
def _keep_segments_if_failed(recorder: SegmentRecorder) -> Iterator[None]:
    try:
        yield
    except BaseException:
        open_segment = recorder._open
        if isinstance(open_segment, CudaSegment):
            try:  # leave capture mode, so the session can go on to smaller sizes
                open_segment.graph.capture_end()
            except RuntimeError:
                pass
        _failed_segments.extend(recorder.segments + ([open_segment] if open_segment else []))
        raise
