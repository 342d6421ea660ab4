"""`cgtool models`: the built-in presets and the architectures that load."""

from __future__ import annotations

from cgtool.commands.common import FormatOption, OutputFormat, cli_errors, console
from cgtool.reports.formats import print_tables
from cgtool.reports.tables import TableData, models_rows, vision_models_rows
from cgtool.specs.config import SUPPORTED_ARCHITECTURES, load_preset, preset_names
from cgtool.specs.vision import load_vision_preset, vision_preset_names

ARCHITECTURES_TITLE = "Architectures that load from a HF folder"


@cli_errors
def models(output: FormatOption = OutputFormat.table) -> None:
    """List built-in model presets and vision presets (shapes only, random weights) and supported architectures."""
    presets = models_rows([load_preset(name) for name in preset_names()])
    vision = vision_models_rows([load_vision_preset(name) for name in vision_preset_names()])
    if output is OutputFormat.table:
        print_tables(console, [presets, vision], output.value)
        console.print(f"{ARCHITECTURES_TITLE}: " + ", ".join(SUPPORTED_ARCHITECTURES))
        return
    architectures = TableData(ARCHITECTURES_TITLE, ["architecture"],
                              [[name] for name in SUPPORTED_ARCHITECTURES])
    print_tables(console, [presets, vision, architectures], output.value)
