"""The optional `images` field of request traces: read, kept in arrival order, written back."""

from __future__ import annotations

import pytest
from text_files import write_lines
from typer.testing import CliRunner

from cgtool.commands.main import app
from cgtool.errors import InputError
from cgtool.traces.trace import RequestTrace, read_trace, write_trace

runner = CliRunner()


def test_images_follow_their_requests_when_sorted_by_arrival(tmp_path):
    path = write_lines(
        tmp_path,
        [
            '{"arrival": 2, "input_len": 30, "output_len": 3, "images": [[448, 448], [896, 672]]}',
            '{"arrival": 1, "input_len": 10, "output_len": 1}',
            '{"arrival": 0, "input_len": 20, "output_len": 2, "images": [[1080.0, 1920]]}',
        ],
    )
    trace = read_trace(path)
    assert isinstance(trace, RequestTrace)
    assert trace.input_len.tolist() == [20, 10, 30]
    assert trace.images is not None
    assert trace.images.tolist() == [((1080, 1920),), (), ((448, 448), (896, 672))]


def test_a_trace_without_images_keeps_none(tmp_path):
    path = write_lines(tmp_path, ['{"arrival": 0, "input_len": 5, "output_len": 1}'])
    assert read_trace(path).images is None


def test_images_survive_take_and_a_write_read_round_trip(tmp_path):
    path = write_lines(
        tmp_path,
        [
            '{"arrival": 0, "input_len": 5, "output_len": 1, "images": [[448, 448]]}',
            '{"arrival": 1, "input_len": 6, "output_len": 1, "images": []}',
            '{"arrival": 2, "input_len": 7, "output_len": 1, "images": [[28, 5600]]}',
        ],
    )
    trace = read_trace(path)
    out = tmp_path / "out.jsonl"
    write_trace(trace, out)
    again = read_trace(out)
    assert again.images.tolist() == trace.images.tolist()
    assert trace.take(trace.input_len > 5).images.tolist() == [(), ((28, 5600),)]


@pytest.mark.parametrize(
    ("images", "expected"),
    [
        ('"448x448"', "field 'images': is '448x448', not a list"),
        ("[[448]]", "field 'images[0]': is [448], not a [height, width] pair"),
        ("[[448, 448], [1, 2, 3]]", "field 'images[1]': is [1, 2, 3], not a"),
        ("[[0, 448]]", "field 'images[0] height': is 0, but must be at least 1"),
        ("[[448, -2]]", "field 'images[0] width': is -2, but must be at least 1"),
        ('[[448, "wide"]]', "field 'images[0] width': is 'wide', not a number"),
        ("[[448, true]]", "field 'images[0] width': is True, not a number"),
        ("[[448.5, 448]]", "field 'images[0] height': is 448.5, not a whole number"),
    ],
)
def test_bad_images_name_file_line_and_field(tmp_path, images, expected):
    path = write_lines(
        tmp_path,
        [
            '{"arrival": 0, "input_len": 5, "output_len": 1}',
            f'{{"arrival": 1, "input_len": 5, "output_len": 1, "images": {images}}}',
        ],
    )
    with pytest.raises(InputError) as caught:
        read_trace(path)
    assert str(caught.value).startswith(f"{path}, line 2, {expected}")


def test_bad_images_are_one_line_and_exit_2_from_the_cli(tmp_path):
    path = write_lines(
        tmp_path, ['{"arrival": 0, "input_len": 5, "output_len": 1, "images": [[448]]}']
    )
    result = runner.invoke(app, ["trace", "stats", str(path)])
    assert result.exit_code == 2
    assert "line 1, field 'images[0]'" in result.stderr and str(path) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
