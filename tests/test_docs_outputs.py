"""What the README and docs/ci-log.md show `cgtool plan` printing for the bundled example is
what it prints now: the flags a reader would paste (the printed blocks are copied by hand or by
scripts/ci-log-transcript.sh, and went stale once)."""

import re
from pathlib import Path

import pytest
from cli_run import cgtool

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "azure-conv-first-1000.jsonl"
# The README's shown output cuts long lines to a fixed width and marks the cut so.
CUT = " ..."


@pytest.fixture(scope="module")
def printed_flags() -> list[str]:
    result = cgtool("plan", "--trace", EXAMPLE, "--gpu", "H100-80GB")
    assert result.exit_code == 0, result.output
    return _flag_lines(result.output.split("# The same sizes for vLLM")[0])


def _flag_lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.startswith("--")]


def _block_after(page: Path, marker: str) -> str:
    text = page.read_text(encoding="utf-8")
    start = text.index(marker)
    block = re.search(r"```(?:text|console)\n(.*?)```", text[start:], re.DOTALL)
    assert block, f"{page.name}: no output block after {marker!r}"
    return block.group(1)


def test_the_readme_shows_the_flags_the_quickstart_prints(printed_flags):
    shown = _flag_lines(_block_after(ROOT / "README.md", "The first command printed"))
    assert len(shown) == len(printed_flags)
    for line, now in zip(shown, printed_flags):
        assert now.startswith(line[: -len(CUT)]) if line.endswith(CUT) else now == line, (line, now)


def test_the_ci_log_shows_the_flags_plan_prints(printed_flags):
    shown = _block_after(ROOT / "docs" / "ci-log.md", "## plan")
    assert _flag_lines(shown.split("# The same sizes for vLLM")[0]) == printed_flags, (
        "run scripts/ci-log-transcript.sh")
