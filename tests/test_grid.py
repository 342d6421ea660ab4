import numpy as np

from cgtool.planner.grid import decode_grid, decode_grid_up, token_grid_up


def test_tokens_round_up_to_16_up_to_1024_and_to_64_above():
    tokens = np.array([1, 16, 17, 1002, 1024, 1025, 1100, 5000])
    assert token_grid_up(tokens, 8192).tolist() == [16, 16, 32, 1008, 1024, 1088, 1152, 5056]


def test_no_bin_exceeds_the_limit():
    assert token_grid_up(np.array([8190, 8192]), 8192).tolist() == [8192, 8192]
    assert token_grid_up(np.array([500]), 500).tolist() == [500]


def test_decode_grid_is_sglangs_list_starting_at_1():
    grid = decode_grid(64)
    assert grid[:4] == [1, 2, 4, 8] and grid[-1] == 64
    assert decode_grid_up(57, 256) == 64 and decode_grid_up(300, 256) == 256
