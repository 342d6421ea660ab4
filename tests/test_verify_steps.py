from collections import Counter

import numpy as np

from cgtool.verify.steps import StepPopulation, kind_steps, sample_steps, weighted_share


def _population() -> StepPopulation:
    decode = kind_steps(np.arange(1, 257), np.full(256, 40), np.arange(1, 257) * 10)
    extend = kind_steps([64, 100, 900, 4000, 8192], [300, 200, 50, 10, 1], [0, 0, 128, 0, 0])
    return StepPopulation(decode, extend, "trace")


def test_same_seed_gives_the_same_sample():
    assert sample_steps(_population(), 500, seed=3) == sample_steps(_population(), 500, seed=3)


def test_another_seed_gives_another_sample():
    assert sample_steps(_population(), 500, seed=3) != sample_steps(_population(), 500, seed=4)


def test_weights_add_up_to_the_simulated_steps_of_each_kind():
    population = _population()
    steps = sample_steps(population, 500, seed=0)
    for kind in ("decode", "extend"):
        weight = sum(s.weight for s in steps if s.kind == kind)
        assert abs(weight - population.of(kind).total) < 1e-6 * population.total


def test_kinds_are_sampled_in_proportion_to_their_steps():
    population = _population()
    steps = sample_steps(population, 2000, seed=0)
    share = Counter(s.kind for s in steps)["extend"] / len(steps)
    expected = population.extend.total / population.total
    assert abs(share - expected) < 0.01
    assert abs(weighted_share(steps, "extend") - expected) < 1e-9


def test_every_size_bucket_gets_a_step_even_the_rare_largest_prefill():
    steps = sample_steps(_population(), 200, seed=0)
    assert any(s.kind == "extend" and s.size == 8192 for s in steps)
    buckets = {int(np.log2(s.size)) for s in steps if s.kind == "decode"}
    assert buckets == set(range(9))


def test_sizes_within_a_bucket_follow_their_counts():
    decode = kind_steps([32, 33], [900, 100], [0, 0])
    empty = kind_steps([], [], [])
    steps = sample_steps(StepPopulation(decode, empty, "histogram"), 100, seed=1)
    assert Counter(s.size for s in steps) == {32: 90, 33: 10}


def test_steps_carry_the_context_of_their_size():
    steps = sample_steps(_population(), 300, seed=0)
    assert all(s.context == s.size * 10 for s in steps if s.kind == "decode")


def test_a_sample_larger_than_the_simulation_takes_every_step_once():
    decode = kind_steps([1, 2], [3, 2], [5, 5])
    steps = sample_steps(StepPopulation(decode, kind_steps([], [], []), "histogram"), 100)
    assert len(steps) == 5 and all(s.weight == 1.0 for s in steps)


def test_fewer_samples_than_buckets_go_to_the_busiest_buckets():
    steps = sample_steps(_population(), 3, seed=0)
    assert len(steps) == 3
    assert all(s.kind == "decode" for s in steps)  # decode buckets hold the most steps
