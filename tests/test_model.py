import pytest
import torch
from hf_oracle import hf_logits, make_hf_model

from cgtool.attention import make_backend
from cgtool.errors import ConfigError
from cgtool.model.loader import build_model
from cgtool.runtime.engine import ModelRunner, decode_batch, extend_batch
from cgtool.runtime.kv import KVPool
from cgtool.specs.config import load_model_config


def _runner(folder, max_len=64):
    cfg = load_model_config(str(folder))
    model = build_model(cfg, device="cpu", dtype=torch.float32, max_positions=max_len, weights_dir=folder)
    pool = KVPool(cfg, num_slots=512, max_reqs=8, max_context_len=max_len, dtype=torch.float32, device="cpu")
    return ModelRunner(model, pool, make_backend("torch", cfg.num_heads, cfg.head_dim)), cfg


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_logits_match_hf_over_extend_then_decode(tmp_path, arch):
    hf = make_hf_model(arch, tmp_path)
    runner, cfg = _runner(tmp_path)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist() for n in (7, 9, 3)]
    prefix_lens = [0, 5, 0]  # the second request reuses a cached 5-token prefix
    rows = [runner.kv_pool.alloc_request(len(p) + 4)[0] for p in prompts]

    warm = extend_batch(runner.kv_pool, [rows[1]], [0], [prompts[1][:5]])
    runner.forward_eager(warm)
    batch = extend_batch(
        runner.kv_pool, rows, prefix_lens, [p[c:] for p, c in zip(prompts, prefix_lens)]
    )
    logits = runner.model.compute_logits(runner.forward_eager(batch))
    start = 0
    for prompt, cached in zip(prompts, prefix_lens):
        new = len(prompt) - cached
        expected = hf_logits(hf, prompt)[cached:]
        torch.testing.assert_close(logits[start : start + new], expected, atol=1e-4, rtol=1e-4)
        start += new

    seqs = [list(p) for p in prompts]
    for _ in range(3):
        next_ids = [int(torch.randint(0, cfg.vocab_size, (1,), generator=gen)) for _ in seqs]
        batch = decode_batch(runner.kv_pool, rows, [len(s) for s in seqs], next_ids)
        logits = runner.model.compute_logits(runner.forward_eager(batch))
        for i, (seq, tok) in enumerate(zip(seqs, next_ids)):
            seq.append(tok)
            torch.testing.assert_close(logits[i], hf_logits(hf, seq)[-1], atol=1e-4, rtol=1e-4)


def test_missing_weights_suggest_random_weights(tmp_path):
    make_hf_model("llama", tmp_path)
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()
    cfg = load_model_config(str(tmp_path))
    with pytest.raises(ConfigError, match="--random-weights"):
        build_model(cfg, device="cpu", dtype=torch.float32, max_positions=32, weights_dir=tmp_path)


def test_sharded_checkpoint_loads_through_index(tmp_path):
    import json

    from safetensors.torch import load_file, save_file

    hf = make_hf_model("qwen2", tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    names = sorted(tensors)
    weight_map = {}
    for shard, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        fname = f"model-0000{shard + 1}-of-00002.safetensors"
        save_file({n: tensors[n].contiguous() for n in part}, str(tmp_path / fname))
        weight_map |= {n: fname for n in part}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    runner, _cfg = _runner(tmp_path)
    ids = [3, 1, 4, 1, 5]
    row = runner.kv_pool.alloc_request(len(ids))[0]
    hidden = runner.forward_eager(extend_batch(runner.kv_pool, [row], [0], [ids]))
    torch.testing.assert_close(
        runner.model.compute_logits(hidden), hf_logits(hf, ids), atol=1e-4, rtol=1e-4
    )


def test_random_weights_built_in_target_dtype():
    cfg = load_model_config("tiny")
    model = build_model(cfg, device="cpu", dtype=torch.bfloat16, max_positions=64)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert sum(p.numel() for p in model.parameters()) == cfg.param_count()


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v2"])
def test_moe_and_mla_logits_match_hf_over_extend_then_decode(tmp_path, arch):
    test_logits_match_hf_over_extend_then_decode(tmp_path, arch)
