"""`cgtool models`: the built-in presets and the architectures that load."""

from __future__ import annotations

from cgtool.commands.common import cli_errors, console
from cgtool.config import SUPPORTED_ARCHITECTURES, load_preset, preset_names
from cgtool.reports.tables import models_table


@cli_errors
def models() -> None:
    """List built-in model presets (shapes only, random weights) and supported architectures."""
    configs = [load_preset(name) for name in preset_names()]
    console.print(models_table(configs))
    console.print("Architectures that load from a HF folder: " + ", ".join(SUPPORTED_ARCHITECTURES))
