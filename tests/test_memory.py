import pytest

from cgtool.errors import CgtoolError
from cgtool.planner.memory import (
    VLLM_DEFAULT_GPU_MEMORY_UTILIZATION,
    activation_bytes,
    kv_tokens_at,
    margin_bytes,
    margin_parts,
    plan_memory,
    sglang_default_mem_fraction,
    vllm_default_pool,
)
from cgtool.specs.config import load_model_config
from cgtool.specs.gpus import gpu_spec

CFG = load_model_config("llama-3.1-8b")
H100 = gpu_spec("H100-80GB").memory_bytes  # 81559 MiB as NVML reports it
GIB = 1 << 30


def test_sglang_0510_default_fraction_on_h100_by_hand():
    # 512 + 8192 * 1.5 + 256 * 2 + 1/8 * 1024 + 58 sizes * 8 = 13904 MiB reserved
    fraction = sglang_default_mem_fraction(
        "0.5.10", H100, chunked_prefill_size=8192, max_bs=256, num_piecewise_tokens=58
    )
    assert fraction == round((81559 - 13904) / 81559, 3)


def test_sglang_0_5_4_does_not_reserve_for_piecewise_sizes():
    fraction = sglang_default_mem_fraction(
        "0.5.4", H100, chunked_prefill_size=8192, max_bs=256, num_piecewise_tokens=58
    )
    assert fraction == round((81559 - 13440) / 81559, 3)


def test_sglang_reserves_at_least_10_gb_on_large_gpus():
    fraction = sglang_default_mem_fraction(
        "0.5.23", H100, chunked_prefill_size=2048, max_bs=8, num_piecewise_tokens=0
    )
    assert fraction == round((81559 - 10240) / 81559, 3)


def test_small_gpu_default_has_no_floor():
    l4 = gpu_spec("L4").memory_bytes  # 23034 MiB
    fraction = sglang_default_mem_fraction(
        "0.5.10", l4, chunked_prefill_size=2048, max_bs=24, num_piecewise_tokens=0
    )
    assert fraction == round((23034 - (512 + 3072 + 48 + 128)) / 23034, 3)


def plan(**overrides):
    args = {
        "graph_bytes": 1 * GIB,
        "chunked_prefill_size": 8192,
        "max_running_requests": 256,
        "peak_kv_demand_tokens": 100_000,
        "typical_request_tokens": 1500,
        "default_mem_fraction_static": 0.83,
    }
    return plan_memory(CFG, H100, **(args | overrides))


def test_recommended_fraction_leaves_activations_graphs_and_the_margin_free():
    memory = plan()
    free = (1 - memory.mem_fraction_static) * H100
    assert free >= memory.activation_bytes + memory.graph_bytes + memory.margin_bytes
    assert (
        free - (memory.activation_bytes + memory.graph_bytes + memory.margin_bytes) < 0.001 * H100
    )
    assert memory.margin_bytes == margin_bytes(CFG, 256) == sum(memory.margin_parts.values())
    assert {"cuda_context", "cublas_workspaces", "sampler_logits", "first_forward", "fragmentation",
            "headroom"} == set(memory.margin_parts)


def test_kv_tokens_are_the_static_share_minus_weights():
    memory = plan()
    assert memory.kv_tokens == kv_tokens_at(CFG, H100, memory.mem_fraction_static)
    assert memory.kv_bytes <= memory.mem_fraction_static * H100 - memory.weights_bytes
    assert memory.default_kv_tokens == kv_tokens_at(CFG, H100, 0.83)


def test_more_graph_memory_means_a_smaller_fraction():
    assert (
        plan(graph_bytes=4 * GIB).mem_fraction_static
        < plan(graph_bytes=1 * GIB).mem_fraction_static
    )


def test_engine_fractions_describe_the_same_kv_budget():
    memory = plan()
    # vLLM counts everything it allocates, so only the margin stays outside
    assert memory.gpu_memory_utilization == pytest.approx(1 - memory.margin_bytes / H100, abs=0.002)
    # TensorRT-LLM's fraction is of the memory left after weights, activations and graphs
    free_after = H100 - memory.weights_bytes - memory.activation_bytes - memory.graph_bytes
    assert memory.trtllm_free_gpu_memory_fraction == pytest.approx(
        memory.kv_bytes / free_after, abs=0.001
    )


def test_activation_peak_grows_with_the_prefill_chunk():
    assert activation_bytes(CFG, 16384, 256) > activation_bytes(CFG, 4096, 256)


def test_a_model_that_leaves_no_kv_cache_is_refused():
    with pytest.raises(CgtoolError, match="does not fit") as exc:
        plan_memory(
            CFG,
            16 * GIB,
            graph_bytes=GIB,
            chunked_prefill_size=8192,
            max_running_requests=256,
            peak_kv_demand_tokens=0,
            typical_request_tokens=100,
            default_mem_fraction_static=0.8,
        )
    assert "tensor parallelism" in exc.value.remedy


def test_warns_when_the_trace_needs_more_kv_than_the_plan_leaves():
    memory = plan(peak_kv_demand_tokens=10_000_000)
    assert any("queue for memory" in w for w in memory.warnings)


def test_warns_when_the_pool_holds_fewer_requests_than_may_run():
    memory = plan(typical_request_tokens=100_000, max_running_requests=1024)
    assert memory.reachable_batch < 1024
    assert any("--max-running-requests 1024" in w for w in memory.warnings)


def test_tp2_sizes_each_gpu_from_its_shard():
    one, two = plan(), plan(tp_size=2)
    assert two.weights_bytes == 2 * 4_015_263_744  # test_parallel's hand count, about half
    assert two.weights_bytes < 0.51 * one.weights_bytes
    assert two.kv_heads_per_rank == 4 and two.tp_size == 2
    # every KV token costs this GPU 4 of the 8 KV heads: 65536 bytes instead of 131072
    assert two.kv_bytes == two.kv_tokens * 65_536
    assert one.kv_bytes == one.kv_tokens * 131_072
    # NCCL's buffers are a part of the margin; the fragmentation share shrinks with the shard
    assert two.margin_parts["nccl"] == 2 * GIB // 8 and "nccl" not in one.margin_parts
    assert two.margin_parts["fragmentation"] < one.margin_parts["fragmentation"]
    free = (1 - two.mem_fraction_static) * H100
    assert free >= two.activation_bytes + two.graph_bytes + two.margin_bytes
    assert two.kv_tokens == kv_tokens_at(CFG, H100, two.mem_fraction_static, tp_size=2)
    assert two.kv_tokens > 2 * one.kv_tokens  # half the KV a token, and room the weights freed


def test_activations_shrink_with_tp_but_the_gathered_logits_do_not():
    assert activation_bytes(CFG, 8192, 256, tp_size=2) < activation_bytes(CFG, 8192, 256)
    # The logits are gathered whole on every GPU: the sampler's part of the margin keeps them.
    one = margin_parts(CFG, 4096)["sampler_logits"]
    assert margin_parts(CFG, 4096, tp_size=8)["sampler_logits"] == one


def test_replicated_kv_heads_stop_the_kv_saving():
    tiny = load_model_config("tiny")
    gpu = 8 * GIB
    at = {tp: kv_tokens_at(tiny, gpu, 0.5, tp_size=tp) for tp in (1, 2, 4)}
    assert at[2] == pytest.approx(2 * at[1], rel=0.01)
    # 2 KV heads over 4 GPUs: each still holds one, so only the weights' share grows the pool
    assert at[4] == pytest.approx(at[2], rel=0.01)


def test_vllm_default_pool_is_its_utilisation_less_weights_and_activations():
    tokens, fraction = vllm_default_pool(CFG, H100, chunked_prefill_size=8192, max_num_seqs=1024)
    budget = VLLM_DEFAULT_GPU_MEMORY_UTILIZATION * H100 - CFG.weight_bytes(2)
    budget -= activation_bytes(CFG, 8192, 1024)
    assert tokens == int(budget // CFG.kv_bytes_per_token(2))
    # The fraction counts weights and pool, as SGLang's does, not vLLM's activations.
    assert fraction == round((CFG.weight_bytes(2) + budget) / H100, 3)


def test_vllm_default_pool_is_empty_when_the_weights_do_not_fit():
    # 16 GB of bf16 weights on a 12 GiB GPU.
    tokens, _ = vllm_default_pool(CFG, 12 * GIB, chunked_prefill_size=2048, max_num_seqs=256)
    assert tokens == 0


def test_mla_model_sizes_its_pool_by_the_latent():
    from cgtool.planner.memory import kv_tokens_at

    ds = load_model_config("deepseek-v2-lite")
    gib80 = 80 * (1 << 30)
    expected = int((0.8 * gib80 - ds.weight_bytes(2)) // (27 * 576 * 2))
    assert kv_tokens_at(ds, gib80, 0.8) == expected


def test_moe_and_mla_models_refuse_tensor_parallelism_with_one_sentence():
    from cgtool.errors import CgtoolError
    from cgtool.planner.parallel import check_tp_size

    for name in ("qwen3-30b-a3b", "deepseek-v2-lite"):
        with pytest.raises(CgtoolError, match="experts or latent attention") as err:
            check_tp_size(load_model_config(name), 2)
        assert "--tp 1 " in str(err.value)
