"""benchmarks/kernel_census.py: kernels of a profiled forward by family, from Chrome traces."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "benchmarks/kernel_census.py"


def _census_module():
    spec = importlib.util.spec_from_file_location("kernel_census", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _capture(folder: Path, kernels: dict[int, list[str]]) -> None:
    folder.mkdir()
    sizes = [{"kind": "decode", "size": bs, "replay_ms": 0.1 * bs, "kernels_per_forward": len(names)}
             for bs, names in kernels.items()]
    report = {"model": {"name": "tiny"}, "environment": {"gpu_name": "GPU"}, "settings": {"context_len": 64},
              "sizes": sizes}
    (folder / "report.json").write_text(json.dumps(report))
    for bs, names in kernels.items():
        events = [{"ph": "X", "cat": "kernel", "name": n, "dur": 2.0, "ts": i} for i, n in enumerate(names)]
        events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "dur": 9.0, "ts": 99})
        (folder / f"trace_decode_{bs}.json").write_text(json.dumps({"traceEvents": events}))


def test_kernels_are_counted_by_family_and_only_the_ones_that_move_are_tabulated(tmp_path):
    census = _census_module()
    assert census.family("void at::native::elementwise_kernel<128, 4>(int, float)") == "at::native::elementwise_kernel"
    assert census.family("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT") == "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"
    moving = ["_norm", "void copy<int>(int)", "_merge"]
    _capture(tmp_path / "tiny", {1: ["_lm_head", *moving[:2]], 8: ["_lm_head", *moving, *moving]})
    result = census.census(tmp_path / "tiny")
    assert result["sizes"][1]["kernels"] == 3 and result["sizes"][8]["kernels"] == 7  # no memcpy
    assert result["sizes"][8]["families"]["copy"] == [2, 4.0]
    assert result["sizes"][8]["report_kernels_per_forward"] == 7
    table = census.markdown(result)
    assert "`_merge` | 0 (0 us) | 2 (4 us)" in table and "`_norm` | 1 (2 us) | 2 (4 us)" in table
    assert "_lm_head" not in table  # one launch at every size: not what moves
    assert "**all kernels** | 3 (6 us) | 7 (14 us)" in table
