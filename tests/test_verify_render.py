from rich.console import Console
from verify_fixture import synthetic_result

from cgtool.reports.verify_html import render_verify
from cgtool.reports.verify_view import print_verify, verify_tables


def test_terminal_output_names_the_ratio_headroom_and_both_sets():
    console = Console(record=True, width=200)
    print_verify(console, synthetic_result())
    text = console.export_text()
    assert "plan / default step time" in text and "headroom" in text
    assert "default" in text and text.strip().splitlines()[-1].startswith("OK")


def test_an_out_of_memory_result_shows_the_remedy_and_no_timing_tables():
    result = synthetic_result()
    result.status, result.ratio, result.sets = "oom", None, []
    result.reason = "eager extend of 8192 tokens ran out of memory at --mem-fraction-static 0.99"
    result.rehearsal.status, result.rehearsal.failed_step = "oom", "eager extend of 8192 tokens"
    result.rehearsal.remedy = "Lower --mem-fraction-static to 0.90 or below (the plan says 0.990)."
    assert [t.title for t in verify_tables(result)] == ["Memory rehearsal at the plan's fraction"]
    console = Console(record=True, width=200)
    print_verify(console, result)
    text = console.export_text()
    assert "FAIL" in text and "Lower --mem-fraction-static" in text


def test_html_page_embeds_a_figure_per_kind(tmp_path):
    files = render_verify(synthetic_result(), tmp_path)
    names = sorted(p.name for p in files)
    assert names == ["verify.html", "verify_decode_step_ms.png", "verify_extend_step_ms.png"]
    page = (tmp_path / "verify.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "Verification on the GPU" in page


def test_piped_output_keeps_every_cell_whole(capsys):
    from cgtool.commands.common import make_console

    print_verify(make_console(), synthetic_result())  # stdout is captured: not a terminal
    text = capsys.readouterr().out
    assert "…" not in text and "Measured vs predicted" in text
