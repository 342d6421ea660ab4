"""ViT graphs: one CUDA graph of the vision blocks and merger per image grid, keyed by its
patch count (SGLang's graph_key = S), replayed only for that exact grid.

As in SGLang (seed 001), the patch embedding runs eagerly and writes the blocks' input into a
static buffer; the graph reads it, runs every block and the merger, and writes the merged
tokens into a static output. Unlike decode graphs there is no padding: a grid fixes the
attention segments (cu_seqlens), so an image of another grid cannot reuse a graph.
"""

from __future__ import annotations

from functools import partial

import torch

from cgtool.model.vit import VisionLayout, VisionTower, vision_layout
from cgtool.runners.graphs import warm_and_record
from cgtool.runners.pitfalls import StaticInputs
from cgtool.runners.pool import SizeStep, freeze_gc, just_record
from cgtool.runners.sizes import capture_sizes

Grid = tuple[int, int]  # (rows, columns) of patches


class VitGraphRunner:
    def __init__(
        self, tower: VisionTower, grids: list[Grid], enable_cudagraph_gc: bool = False
    ) -> None:
        self.tower = tower
        self.enable_cudagraph_gc = enable_cudagraph_gc
        self.device = next(tower.parameters()).device
        self.layouts: dict[int, VisionLayout] = {}  # by patch count
        for grid in grids:
            layout = vision_layout([grid], tower.preset, self.device)
            other = self.layouts.setdefault(layout.num_patches, layout).grids[0]
            if other != grid:
                raise ValueError(
                    f"grids {other[0]}x{other[1]} and {grid[0]}x{grid[1]} both have "
                    f"{layout.num_patches} patches; a graph is keyed by the patch count"
                )
        self.capture_patches = capture_sizes(self.layouts)
        max_patches = self.capture_patches[-1]
        preset, dtype = tower.preset, next(tower.parameters()).dtype
        with torch.device(self.device):
            self.block_input = torch.zeros((max_patches, preset.hidden_size), dtype=dtype)  # [patches, hidden]
            self.merged = torch.zeros(  # [patches / merge², out_hidden]
                (max_patches // preset.spatial_merge_size**2, preset.out_hidden_size), dtype=dtype
            )
        self.static_inputs = StaticInputs(block_input=self.block_input, merged=self.merged)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}  # kept alive: they share one pool
        self.kernel_nodes: dict[int, int | None] = {}
        self.stream = torch.cuda.Stream() if torch.cuda.is_available() else None
        self.replay_count = 0

    @property
    def static_buffer_bytes(self) -> int:
        """The graphs' input and output buffers and every grid's layout, allocated outside
        the pool: the graphs read and write them in place."""
        tensors = [self.block_input, self.merged]
        for layout in self.layouts.values():
            tensors += [layout.window_index, layout.reverse_index, layout.positions, layout.cos_sin]
            for segments in (layout.full, layout.windows):
                tensors += [t for t in (segments.gather, segments.key_mask, segments.scatter) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    @property
    def captured_patches(self) -> list[int]:
        return sorted(self.graphs)

    def _encode_into_merged(self, patches: int) -> None:
        layout = self.layouts[patches]
        merged = self.tower.encode(self.block_input[:patches], layout)
        self.merged[: merged.shape[0]].copy_(merged)

    def forward_static(self, patches: int) -> None:
        """What capture records, run eagerly: for diagnosing a capture that failed."""
        self._encode_into_merged(patches)

    def capture(self, step: SizeStep = just_record) -> None:
        """Record one graph per grid into the global pool, the most patches first, so the
        smaller graphs reuse the memory the largest took; GC frozen for the loop."""
        with freeze_gc(self.enable_cudagraph_gc):
            for index, patches in enumerate(reversed(self.capture_patches)):
                if not step(index, patches, partial(self._record, patches)):
                    break

    def _record(self, patches: int) -> None:
        recorded = warm_and_record(partial(self._encode_into_merged, patches), self.stream)
        self.graphs[patches] = recorded.graph
        self.kernel_nodes[patches] = recorded.kernels

    def graph_kernels(self, patches: int) -> int | None:
        """Kernels one replay of the grid's graph launches, read from the graph at capture."""
        return self.kernel_nodes.get(patches)

    def can_run(self, grid: Grid) -> bool:
        layout = self.layouts.get(grid[0] * grid[1])
        return layout is not None and layout.grids[0] == grid and layout.num_patches in self.graphs

    def replay(self, pixels: torch.Tensor, grid: Grid) -> torch.Tensor:
        """[patches, patch_dim] pixels of one image of `grid` to its merged tokens
        [patches / merge², out_hidden] in raster order, through the grid's graph."""
        self.static_inputs.check(block_input=self.block_input, merged=self.merged)
        layout = self.layouts[grid[0] * grid[1]]
        patches = layout.num_patches
        self.block_input[:patches].copy_(self.tower.embed(pixels, layout))
        self.graphs[patches].replay()
        self.replay_count += 1
        return self.merged[: layout.reverse_index.shape[0]][layout.reverse_index]

    def eager(self, pixels: torch.Tensor, grid: Grid) -> torch.Tensor:
        """What `replay` returns, computed without graphs: the oracle replay is checked by."""
        return self.tower(pixels, self.layouts[grid[0] * grid[1]])

    def forward(self, pixels: torch.Tensor, grid: Grid) -> torch.Tensor:
        if self.can_run(grid):
            return self.replay(pixels, grid)
        return self.tower(pixels, vision_layout([grid], self.tower.preset, self.device))
