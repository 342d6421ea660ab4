"""Rich tables for the terminal."""

from __future__ import annotations

from rich.table import Table

from cgtool.config import ModelConfig


def gib(num_bytes: float) -> str:
    return f"{num_bytes / (1 << 30):.2f} GiB"


def models_table(configs: list[ModelConfig]) -> Table:
    table = Table(title="Model presets")
    for column in ("preset", "architecture", "layers", "hidden", "heads/kv", "params", "bf16 weights"):
        table.add_column(column, no_wrap=True, justify="left" if column in ("preset", "architecture") else "right")
    for cfg in configs:
        table.add_row(
            cfg.name,
            cfg.architecture,
            str(cfg.num_layers),
            str(cfg.hidden_size),
            f"{cfg.num_heads}/{cfg.num_kv_heads}",
            f"{cfg.param_count() / 1e9:.2f} B",
            gib(cfg.weight_bytes(2)),
        )
    return table
