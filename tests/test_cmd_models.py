
from cli_run import piped
from typer.testing import CliRunner

from cgtool import __version__
from cgtool.commands.main import app
from cgtool.specs.config import preset_names

runner = CliRunner()


def test_help_lists_every_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("plan", "capture", "check", "schedule", "trace", "report", "models"):
        assert command in result.output


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_models_lists_presets_with_params_and_bytes():
    result = runner.invoke(app, ["models"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    row = next(line.split() for line in result.output.splitlines() if " llama-3.1-8b " in line)
    assert row[-2:] == ["8.03", "14.96"]  # billions of params, and x 2 bytes in GiB
    assert "GiB" in result.output and "GiB" not in " ".join(row)  # the unit heads the column
    assert "Qwen3ForCausalLM" in result.output


def test_models_piped_keeps_every_cell_whole():
    out = piped("models").stdout
    assert "…" not in out
    for preset in preset_names():
        assert f" {preset} " in out
    assert "Qwen3ForCausalLM" in out.splitlines()[-1]  # the architectures line is not wrapped


def test_models_lists_the_vision_presets_kind_vit_takes():
    result = runner.invoke(app, ["models"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    row = next(line.split() for line in result.output.splitlines() if " qwen2.5-vl-7b " in line)
    assert row[1:6] == ["32", "1280", "16", "14", "112"]
