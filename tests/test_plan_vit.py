"""The ViT part of a plan: patch counts from a trace's images, SGLang's switch, plan.json."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cgtool.commands.main import app
from cgtool.documents.results import load_plan
from cgtool.planner.grid import MIN_BIN_SHARE
from cgtool.planner.vit import vit_plan
from cgtool.specs.vision import SGLANG_VIT_GRAPH_ENV

runner = CliRunner()


def test_no_images_means_no_vit_plan():
    assert vit_plan(None) is None
    assert vit_plan([(), ()]) is None


def test_patch_counts_serving_enough_images_get_graphs_with_their_commonest_size():
    # 300 images of 1024 patches (two sizes snap to 448x448), 100 of 4096, one rare, one refused.
    images = [[(448, 448)]] * 200 + [[(450, 446)]] * 100 + [[(896, 896)]] * 100
    images += [[(1400, 1400)], [(28, 28 * 250)]]
    plan = vit_plan(images)
    assert plan is not None and plan.env == SGLANG_VIT_GRAPH_ENV
    assert plan.num_images == 402 and plan.refused_images == 1
    assert plan.capture_patches == [1024, 4096]  # 1 image of 1400 px is under MIN_BIN_SHARE
    assert plan.image_sizes == [[448, 448], [896, 896]]
    assert plan.coverage == 400 / 402 and plan.min_share == MIN_BIN_SHARE


def _trace_with_images(path: Path) -> Path:
    lines = [{"arrival": i * 0.5, "input_len": 200 + i, "output_len": 20,
              **({"images": [[448, 448]] if i % 3 else [[896, 672]]} if i % 2 else {})}
             for i in range(60)]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def test_plan_prints_the_vit_shapes_and_the_env_line_and_writes_them(tmp_path):
    trace = _trace_with_images(tmp_path / "t.jsonl")
    result = runner.invoke(app, ["plan", "--trace", str(trace), "--model", "qwen2.5-7b",
                                 "--gpu", "H100-80GB", "--out", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    assert f"{SGLANG_VIT_GRAPH_ENV} python -m sglang.launch_server \\" in result.output
    assert "ViT graphs for 30 images" in result.output and "patch counts: 1024 3072" in result.output
    assert "--kind vit --model qwen2.5-vl-7b --image-sizes 448x448,896x672" in result.output
    plan = load_plan(tmp_path / "p")
    assert plan.vit is not None and plan.vit.capture_patches == [1024, 3072]


def test_a_trace_without_images_writes_no_vit_field(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"arrival": i, "input_len": 100, "output_len": 10}) + "\n"
                             for i in range(20)))
    result = runner.invoke(app, ["plan", "--trace", str(trace), "--gpu", "H100-80GB", "--json"])
    assert result.exit_code == 0, result.output
    assert "vit" not in json.loads(result.stdout)
    assert "SGLANG_VIT" not in result.stdout
