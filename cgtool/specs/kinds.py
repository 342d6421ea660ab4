"""The two kinds cgtool names, decided here and nowhere else.

A *step kind* is what the scheduler runs (SGLang's ForwardMode): a decode step over running
requests, or an extend step over new prompt tokens. A *graph kind* is what is captured: decode
graphs per batch size, prefill graphs per token count (called piecewise, whichever backend
records them: torch.compile pieces or breakable graphs), and vision-tower graphs. An extend step
replays a piecewise graph; a decode step replays a decode graph.
"""

from __future__ import annotations

from typing import Literal

StepKind = Literal["decode", "extend"]
STEP_KINDS: tuple[StepKind, ...] = ("decode", "extend")

GraphKind = Literal["decode", "piecewise", "vit"]
GRAPH_KINDS: tuple[GraphKind, ...] = ("decode", "piecewise", "vit")

GRAPH_KIND_OF_STEP: dict[StepKind, GraphKind] = {"decode": "decode", "extend": "piecewise"}

# The largest size of a graph of each kind (decode batch, prefill tokens, vision patches), 64-128x
# past the engines' own defaults (SGLang's max_bs 512, vLLM's 1024; chunks of 8,192-16,384
# tokens). Past them a capture never ends, and a table indexed by size outgrows host memory.
MAX_GRAPH_SIZE: dict[GraphKind, int] = {"decode": 1 << 16, "piecewise": 1 << 20, "vit": 1 << 20}
