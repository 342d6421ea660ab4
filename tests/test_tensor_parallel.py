"""Tensor parallelism on the CPU: TP=2 over gloo in two processes against TP=1 in this one."""

from __future__ import annotations

import time

import pytest
import torch
import tp_worker
from hf_oracle import make_hf_model

from cgtool.capture.launch import run_ranks
from cgtool.errors import CgtoolError, ConfigError, EnvironmentProblem
from cgtool.model.loader import build_model
from cgtool.model.parallel import check_tp_shapes, kv_head_range, linear, local_config, vocab_range
from cgtool.runners.piecewise_backend import registered_split_ops
from cgtool.runtime.distributed import ALL_REDUCE_OP, SINGLE, TensorParallel
from cgtool.specs.config import load_model_config

# name: (HF architecture, shape overrides); 4 query heads, 2 KV heads and 97 tokens unless said
HF_CASES = {
    "llama": ("llama", {}),
    "qwen2-qkv-bias-tied": ("qwen2", {}),
    "qwen3-qk-norm": ("qwen3", {}),
    "qwen2-one-kv-head": ("qwen2", {"num_key_value_heads": 1}),  # fewer KV heads than ranks
}
CASE_NAMES = [*HF_CASES, "tiny-random-fp32", "tiny-random-bf16"]


@pytest.fixture(scope="module")
def tp2_runs(tmp_path_factory):
    """Every case's TP=2 logits, from one pair of processes (spawning costs seconds)."""
    cases = []
    for name, (arch, overrides) in HF_CASES.items():
        folder = tmp_path_factory.mktemp(name)
        make_hf_model(arch, folder, **overrides)
        cases.append((str(folder), torch.float32, True))
    cases += [("tiny", torch.float32, False), ("tiny", torch.bfloat16, False)]
    return dict(zip(CASE_NAMES, zip(cases, run_ranks(tp_worker.logits_rank, 2, (cases,)))))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_tp2_logits_equal_tp1_eager_over_extend_and_decode(tp2_runs, name):
    (model, dtype, weights), tp2 = tp2_runs[name]
    tp1 = tp_worker.extend_then_decode(tp_worker.make_runner(model, SINGLE, dtype, weights), None)
    assert len(tp2) == len(tp1) == 4  # prefix warm-up, extend of three requests, two decodes
    for got, expected in zip(tp2, tp1):
        assert got.shape == expected.shape  # the whole vocabulary, gathered from both ranks
        # fp32: only the order of the partial sums differs; bf16: a couple of ulps at |logit| ~2.
        tol = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps * expected.abs().max()
        torch.testing.assert_close(got, expected, atol=float(tol), rtol=0)


def test_random_weights_are_slices_of_the_tp1_weights():
    cfg = load_model_config("tiny")  # 4 heads of 32, 2 KV heads, MLP 256, vocab 512
    full = build_model(cfg, device="cpu", dtype=torch.float32, max_positions=32)
    rank1 = build_model(cfg, device="cpu", dtype=torch.float32, max_positions=32, tp=TensorParallel(1, 2))
    attn, attn1 = full.model.layers[1].self_attn, rank1.model.layers[1].self_attn
    q, k, v = attn.qkv_proj.weight.split([128, 64, 64])
    expected_qkv = torch.cat([q[64:], k[32:], v[32:]])  # heads 2-3 and KV head 1
    torch.testing.assert_close(attn1.qkv_proj.weight, expected_qkv, rtol=0, atol=0)
    torch.testing.assert_close(attn1.o_proj.weight, attn.o_proj.weight[:, 64:], rtol=0, atol=0)
    mlp, mlp1 = full.model.layers[0].mlp, rank1.model.layers[0].mlp
    gate, up = mlp.gate_up_proj.weight.split([256, 256])
    torch.testing.assert_close(mlp1.gate_up_proj.weight, torch.cat([gate[128:], up[128:]]), rtol=0, atol=0)
    torch.testing.assert_close(mlp1.down_proj.weight, mlp.down_proj.weight[:, 128:], rtol=0, atol=0)
    torch.testing.assert_close(rank1.lm_head.weight, full.lm_head.weight[256:], rtol=0, atol=0)


def test_sharded_shapes_per_rank_with_vocab_padding_and_replicated_kv_heads(tmp_path):
    make_hf_model("qwen2", tmp_path, num_key_value_heads=1)  # 4 heads of 16, 1 KV head, vocab 97
    cfg = load_model_config(str(tmp_path))
    for rank in (0, 1):
        model = build_model(cfg, device="cpu", dtype=torch.float32, max_positions=32,
                            weights_dir=tmp_path, tp=TensorParallel(rank, 2))
        attn = model.model.layers[0].self_attn
        assert tuple(attn.qkv_proj.weight.shape) == ((2 + 1 + 1) * 16, 64)  # 2 heads, KV head copied
        assert tuple(attn.qkv_proj.bias.shape) == (64,)
        assert tuple(attn.o_proj.weight.shape) == (64, 32)
        assert tuple(model.model.layers[0].mlp.gate_up_proj.weight.shape) == (96, 64)
        assert tuple(model.model.layers[0].mlp.down_proj.weight.shape) == (64, 48)
        assert tuple(model.model.embed_tokens.weight.shape) == (49, 64)  # ceil(97 / 2)
        assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied
    assert model.model.embed_tokens.weight[-1].abs().sum() == 0  # rank 1's padding row
    assert (attn.cfg.num_heads, attn.cfg.num_kv_heads) == (2, 1)


@pytest.mark.parametrize(("kv_heads", "tp_size", "expected"), [
    (8, 2, [(0, 4), (4, 8)]),
    (2, 4, [(0, 1), (0, 1), (1, 2), (1, 2)]),  # each KV head on the ranks of its query heads
    (1, 2, [(0, 1), (0, 1)]),
])
def test_kv_heads_split_or_replicated(kv_heads, tp_size, expected):
    cfg = load_model_config("llama-3.1-8b")
    cfg = type(cfg)(**{**{f: getattr(cfg, f) for f in cfg.__slots__}, "num_kv_heads": kv_heads})
    assert [kv_head_range(cfg, TensorParallel(r, tp_size)) for r in range(tp_size)] == expected
    assert local_config(cfg, TensorParallel(0, tp_size)).num_kv_heads == expected[0][1] - expected[0][0]


def test_vocab_rows_cover_the_vocabulary_once():
    ranges = [vocab_range(128256, TensorParallel(r, 3)) for r in range(3)]
    assert [r for r, _ in ranges] == [(0, 42752), (42752, 85504), (85504, 128256)]
    assert vocab_range(97, TensorParallel(1, 2)) == ((49, 97), 49)


@pytest.mark.parametrize(("preset", "tp_size", "words"), [
    ("tiny", 3, "4 attention heads"),
    ("qwen2.5-0.5b", 4, "14 attention heads"),
    ("qwen2.5-7b", 7, "4 KV heads"),
])
def test_tp_sizes_that_do_not_divide_the_model_are_refused(preset, tp_size, words):
    with pytest.raises(ConfigError, match=words):
        check_tp_shapes(load_model_config(preset), tp_size)


def test_vocab_parallel_gather_puts_shards_in_rank_order_and_drops_padding():
    gathered = run_ranks(tp_worker.gather_rank, 2, ())
    expected = torch.tensor([[0.0, 1.0, 2.0, 1.0, 2.0]] * 2)  # rank 1's third column is padding
    torch.testing.assert_close(gathered, expected)


def test_piecewise_body_splits_at_every_all_reduce():
    assert ALL_REDUCE_OP in registered_split_ops()
    result = run_ranks(tp_worker.piecewise_rank, 2, ())
    layers = load_model_config("tiny").num_layers
    # Split ops: the embedding's all-reduce, then per layer attention, O's and down's all-reduce.
    assert result["pieces"] - result["capturable"] == 1 + 3 * layers
    assert result["capturable"] == 3 * layers + 2
    torch.testing.assert_close(result["compiled"], result["eager"], rtol=1e-5, atol=1e-5)


def test_a_failing_rank_ends_every_rank_with_its_own_message():
    start = time.monotonic()
    with pytest.raises(EnvironmentProblem) as caught:
        run_ranks(tp_worker.failing_rank, 2, ())
    # Rank 0 lost its peer too, later: the message is rank 1's, the cause.
    assert str(caught.value) == "rank 1: the test's rank 1 has no GPU memory left. Lower --max-bs."
    assert time.monotonic() - start < 30  # rank 0 was stopped, not waited for


def test_a_crashing_rank_becomes_one_sentence_and_stops_the_others(tmp_path):
    progress = []
    start = time.monotonic()
    with pytest.raises(CgtoolError) as caught:
        run_ranks(tp_worker.crashing_rank, 2, (), progress.append, log_dir=tmp_path)
    message = str(caught.value)
    assert message.startswith("rank 1: ValueError: an unexpected bug. ")
    assert "\n" not in message and "rank1.log" in message
    assert "Traceback" in (tmp_path / "rank1.log").read_text()
    assert time.monotonic() - start < 30  # rank 0 sleeps for a minute unless stopped


def test_ctrl_c_collects_every_ranks_partial_result():
    def interrupt_on_progress(event):
        raise KeyboardInterrupt  # as Ctrl-C in the coordinator while ranks measure

    with pytest.raises(KeyboardInterrupt) as caught:
        run_ranks(tp_worker.interrupted_rank, 2, (), interrupt_on_progress)
    assert caught.value.rank_partials == {
        0: {"rank": 0, "measured": True}, 1: {"rank": 1, "measured": True}}


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("shape", [(5, 16), (2, 3, 16)])
def test_linear_is_f_linear_bit_for_bit(with_bias, shape):
    """mm / addmm on 2-D input, F.linear otherwise: the op F.linear itself becomes."""
    torch.manual_seed(0)
    x, weight = torch.randn(*shape), torch.randn(24, 16)
    bias = torch.randn(24) if with_bias else None
    assert torch.equal(linear(x, weight, bias), torch.nn.functional.linear(x, weight, bias))


def test_a_linears_transposed_weight_is_made_once_and_again_when_the_weight_changes():
    from cgtool.model.parallel import ColumnParallelLinear, transposed_weight

    torch.manual_seed(0)
    layer = ColumnParallelLinear(16, [8, 8], False, SINGLE)
    x = torch.randn(3, 16)
    first = transposed_weight(layer)
    assert transposed_weight(layer) is first and torch.equal(first, layer.weight.t())
    assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight))
    layer.weight = torch.nn.Parameter(torch.randn(16, 16))  # tied or re-sharded
    assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight))
    layer.to(torch.float64)  # the same Parameter, new storage
    assert torch.equal(layer(x.double()), torch.nn.functional.linear(x.double(), layer.weight))
