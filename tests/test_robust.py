import numpy as np
import pytest
from planner_fixture import CFG, H100, roofline_8b

from cgtool.planner.cost import roofline_cost
from cgtool.planner.eager import eager_range
from cgtool.planner.grid import MIN_BIN_SHARE, token_grid_up
from cgtool.planner.optimiser import Limits
from cgtool.planner.robust import (
    COVER_HEADROOM,
    Scenario,
    Schedule,
    choose_robust,
    cover_decode,
    prune_rare_bins,
    scenario_score,
)
from cgtool.planner.schedules import default_schedule
from cgtool.planner.scoring import Histogram, padded_sizes

COST = roofline_8b()
RANGE = eager_range(COST, CFG)
DEFAULT = default_schedule("sglang", None, gpu_memory_bytes=H100.memory_bytes)
LIMITS = Limits(512, 8192)


def hist(sizes, counts):
    sizes, counts = np.asarray(sizes), np.asarray(counts)
    return Histogram(sizes, counts, counts * 0.01, np.zeros(len(sizes)))


def scenario(load, decode_top, seed=0):
    rng = np.random.default_rng(seed)
    decode = np.arange(1, decode_top + 1)
    tokens = np.unique(rng.integers(20, 3000, 300))
    return Scenario(
        load,
        hist(decode, rng.integers(50, 500, len(decode))),
        hist(tokens, rng.integers(1, 40, len(tokens))),
    )


@pytest.fixture(scope="module")
def two_loads():
    return [scenario(1.0, 30), scenario(2.0, 110, seed=1)]


@pytest.fixture(scope="module")
def choice(two_loads):
    return choose_robust(two_loads, RANGE, DEFAULT, LIMITS, "sglang")


def test_bs_1_is_always_captured(choice):
    assert choice.decode_bs[0] == 1


def test_decode_reaches_past_the_largest_batch_any_scenario_reached(choice):
    assert choice.reached == 110
    assert max(choice.decode_bs) >= 110 * COVER_HEADROOM


def test_token_bins_sit_on_the_grid(choice):
    on_grid = set(token_grid_up(np.array(choice.tokens), 8192).tolist())
    assert set(choice.tokens) <= on_grid | set(DEFAULT.piecewise_tokens)


def test_its_worst_regret_is_no_worse_than_the_defaults(two_loads, choice):
    plan = Schedule("plan", tuple(choice.decode_bs), tuple(choice.tokens))
    default = Schedule("default", DEFAULT.decode_bs, DEFAULT.piecewise_tokens)
    for sc in two_loads:
        for a in RANGE:
            p = scenario_score("plan", sc, a, plan).expected_step_ms
            d = scenario_score("default", sc, a, default).expected_step_ms
            assert p <= d * (1 + 1e-9)
    assert choice.worst_regret >= 0


def test_the_reason_for_max_bs_names_the_batch_it_covers(choice):
    assert f"max-bs {max(choice.decode_bs)}" in choice.max_bs_reason
    assert "(110)" in choice.max_bs_reason


def test_rare_bins_are_dropped_and_their_steps_pad_up():
    # README's rule: a bin serves at least 0.5% of extend steps. 4 of 1,000 is below it,
    # 5 of 1,000 is not.
    below = Scenario(1.0, hist([1], [1]), hist([100, 200, 300], [498, 4, 498]))
    assert prune_rare_bins([112, 208, 304], [below]) == [112, 304]
    at = Scenario(1.0, hist([1], [1]), hist([100, 200, 300], [497, 5, 498]))
    assert prune_rare_bins([112, 208, 304], [at]) == [112, 208, 304]


def test_cover_adds_bs_1_and_the_batch_list_up_to_the_headroom():
    d, t = cover_decode([24], [256], 27, LIMITS, COST, shared=False)
    assert d == [1, 24, 32, 40] and t == [256]  # ceil(27 x 1.25) = 34, up to SGLang's 40


@pytest.mark.parametrize(("fitted", "reached", "expected"), [
    ([126], 126, [1, 128, 136, 144, 152, 160]),  # ceil(126 x 1.25) = 158 -> 160
    ([64, 271], 271, [1, 64, 272, 288, 304, 320, 336, 352]),  # 339 -> 352
])
def test_a_fitted_size_next_to_the_continuation_merges_into_it(fitted, reached, expected):
    # Plans listed "126 128" and "271 272": the grid size now takes the fitted one's batches.
    d, _ = cover_decode(fitted, [], reached, LIMITS, COST, shared=False)
    assert d == expected


def test_cover_keeps_a_fitted_size_that_sits_on_the_list():
    d, _ = cover_decode([8, 120], [], 120, LIMITS, COST, shared=False)
    assert d == [1, 8, 120, 128, 136, 144, 152]  # ceil(120 x 1.25) = 150 -> 152


def test_cover_stops_at_the_graph_budget():
    d, t = cover_decode([27], [256], 27, Limits(512, 8192, budget_graphs=4), COST, shared=False)
    assert len(d) + len(t) == 4 and d[0] == 1


def test_vllm_shared_list_gains_the_decode_sizes_too():
    d, t = cover_decode([8], [8, 512], 8, LIMITS, COST, shared=True)
    assert set(d) <= set(t) and 1 in t


def test_a_budget_excludes_the_default_from_the_candidates(two_loads):
    tight = Limits(512, 8192, budget_graphs=10)
    choice = choose_robust(two_loads, RANGE, DEFAULT, tight, "sglang")
    assert len(choice.decode_bs) + len(choice.tokens) <= 10


def _engine(engine):
    """(eager range, default) per engine: vLLM pads decode batches into its token list, so its
    decode costs run to the token limit, as cgtool.planner.server builds them."""
    if engine == "sglang":
        return RANGE, DEFAULT
    cost = roofline_cost(CFG, H100, max_bs=8192, max_tokens=8192)
    return eager_range(cost, CFG), default_schedule("vllm", None, gpu_memory_bytes=H100.memory_bytes)


def _extend_share(sc, captured, size):
    padded = padded_sizes(sc.extend.sizes, sorted(captured))
    return sc.extend.counts[padded == size].sum() / sc.extend.counts.sum()


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_token_bins_past_the_decode_cover_each_serve_the_stated_share(two_loads, engine):
    # vLLM's list skipped the 0.5% rule; its sizes up to the decode cover are decode graphs.
    choice = choose_robust(two_loads, *_engine(engine), LIMITS, engine)
    above = [t for t in choice.tokens if t > (choice.cover if engine == "vllm" else 0)]
    assert above
    for size in above:
        mean = sum(_extend_share(sc, choice.tokens, size) for sc in two_loads) / len(two_loads)
        assert mean >= MIN_BIN_SHARE, (size, mean)


def test_fixed_sizes_stay_and_take_their_steps():
    sc = Scenario(1.0, hist([1], [1]), hist([50, 100, 200, 300], [10, 1000, 1, 1000]))
    assert prune_rare_bins([64, 112, 208, 304], [sc], fixed=frozenset({64})) == [64, 112, 304]
    assert prune_rare_bins([64, 112, 208, 304], [sc]) == [112, 304]  # 64 served 10 of 2,011


@pytest.mark.parametrize(("engine", "budget"), [("sglang", 6), ("sglang", 10), ("vllm", 12)])
def test_bs_1_is_captured_under_a_graph_budget(two_loads, engine, budget):
    tight = Limits(512, 8192, budget_graphs=budget)
    choice = choose_robust(two_loads, *_engine(engine), tight, engine)
    assert choice.decode_bs[0] == 1
    assert len(choice.decode_bs) + len(choice.tokens) <= budget

