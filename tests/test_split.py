import pytest
import silly_attention
import torch
from silly_attention import SILLY_OP, SillyModel
from torch import fx, nn

from cgtool.attention import ATTENTION_OP, make_backend
from cgtool.model.loader import build_model
from cgtool.runners.split import split_graph
from cgtool.runtime.batch import forward_context
from cgtool.runtime.engine import extend_batch
from cgtool.runtime.kv import KVPool
from cgtool.specs.config import load_model_config


def _kinds(split):
    return ["split" if p.is_split_op else "graph" for p in split.pieces]


def test_silly_model_splits_into_three_capturable_and_two_split_pieces():
    split = split_graph(fx.symbolic_trace(SillyModel()), [SILLY_OP])
    assert _kinds(split) == ["graph", "split", "graph", "split", "graph"]
    assert len(split.capturable_pieces) == 3
    for piece in split.pieces:
        ops = [n for n in piece.graph.graph.nodes if n.op == "call_function"]
        has_silly = any("silly_attention" in str(n.target) for n in ops)
        assert has_silly == piece.is_split_op
        if piece.is_split_op:
            assert len(ops) == 1  # the split op stands alone


def test_split_graph_computes_what_the_original_does():
    gm = fx.symbolic_trace(SillyModel())
    split = split_graph(gm, [SILLY_OP])
    x = torch.randn(5, 3)
    before = silly_attention.calls
    expected = SillyModel()(x)
    got = split.stitching(x)
    assert silly_attention.calls - before == 4  # each op ran once per forward, none dropped
    torch.testing.assert_close(got, expected)


def test_leading_and_adjacent_split_ops_leave_no_empty_piece():
    class Adjacent(nn.Module):
        def forward(self, x, out, out2):
            torch.ops.cgtool_test.silly_attention(x, x, x, out)
            torch.ops.cgtool_test.silly_attention(x, x, x, out2)
            return out + out2

    split = split_graph(fx.symbolic_trace(Adjacent()), [SILLY_OP])
    assert _kinds(split) == ["split", "split", "graph"]
    x, out, out2 = torch.randn(3), torch.empty(3), torch.empty(3)
    torch.testing.assert_close(split.stitching(x, out, out2), 8 * x)


def test_graph_without_split_ops_is_one_capturable_piece():
    split = split_graph(fx.symbolic_trace(SillyModel()), [ATTENTION_OP])
    assert _kinds(split) == ["graph"]


@pytest.fixture(scope="module")
def tiny_dynamo_graph():
    """The decoder body of the tiny preset as dynamo hands it to a backend, and its inputs."""
    cfg = load_model_config("tiny")
    model = build_model(cfg, device="cpu", dtype=torch.float32, max_positions=128)
    pool = KVPool(cfg, num_slots=256, max_reqs=4, max_context_len=128, dtype=torch.float32, device="cpu")
    backend = make_backend("torch", cfg.num_heads, cfg.head_dim)
    graphs, runtime_args = [], []

    def capture_graph(gm, example_inputs):
        graphs.append(gm)

        def run(*args):  # real values: the example inputs may hold symbolic sizes
            runtime_args.append(args)
            return gm(*args)

        return run

    row = pool.alloc_request(24)[0]
    batch = extend_batch(pool, [row], [0], [list(range(24))])
    with forward_context(batch, pool, backend):
        torch.compile(model.model, backend=capture_graph, fullgraph=True)(batch.input_ids, batch.positions)
    return cfg, graphs[0], runtime_args[0], (model, pool, backend, batch)


def test_tiny_model_splits_into_layers_plus_one_capturable_pieces(tiny_dynamo_graph):
    cfg, gm, _, _ = tiny_dynamo_graph
    split = split_graph(gm, [ATTENTION_OP])
    assert len(split.capturable_pieces) == cfg.num_layers + 1
    assert sum(p.is_split_op for p in split.pieces) == cfg.num_layers
    assert _kinds(split) == ["graph", "split"] * cfg.num_layers + ["graph"]


def test_tiny_model_split_output_equals_unsplit(tiny_dynamo_graph):
    _, gm, inputs, (model, pool, backend, batch) = tiny_dynamo_graph
    split = split_graph(gm, [ATTENTION_OP])
    with forward_context(batch, pool, backend):
        expected = model.model(batch.input_ids, batch.positions)
        (got,) = split.stitching(*inputs)  # dynamo graphs return a tuple
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
