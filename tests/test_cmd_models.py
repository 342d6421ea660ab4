from typer.testing import CliRunner

from cgtool import __version__
from cgtool.commands.main import app

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
    assert "llama-3.1-8b" in result.output and "8.03 B" in result.output
    assert "14.96 GiB" in result.output  # 8.03e9 params x 2 bytes
    assert "Qwen3ForCausalLM" in result.output
