import pytest

from cgtool.errors import InputError
from cgtool.specs.hidden_states import (
    HiddenMode,
    decode_hidden_buffer_bytes,
    decode_hidden_rows,
    parse_hidden_modes,
)


def test_modes_parse_case_blind_in_upward_order():
    assert parse_hidden_modes("null") == (HiddenMode.NULL,)
    assert parse_hidden_modes("NULL, full") == (HiddenMode.NULL, HiddenMode.FULL)
    assert parse_hidden_modes("null,last,full") == tuple(HiddenMode)


@pytest.mark.parametrize("text", ["none", "full,null", "last,last", " , "])
def test_unknown_downward_or_empty_modes_are_refused_with_the_remedy(text):
    with pytest.raises(InputError) as error:
        parse_hidden_modes(text)
    assert "--hidden-states" in str(error.value) and "null, last or full" in error.value.remedy


def test_decode_graphs_return_one_hidden_row_per_request_from_last_up():
    assert [decode_hidden_rows(mode, 8) for mode in HiddenMode] == [0, 8, 8]


def test_buffer_bytes_are_rows_by_hidden_size_in_the_model_dtype():
    assert decode_hidden_buffer_bytes(HiddenMode.NULL, 256, 4096, 2) == 0
    assert decode_hidden_buffer_bytes(HiddenMode.LAST, 256, 4096, 2) == 256 * 4096 * 2
    assert decode_hidden_buffer_bytes(HiddenMode.FULL, 160, 896, 4) == 160 * 896 * 4
