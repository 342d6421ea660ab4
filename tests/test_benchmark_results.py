"""benchmarks/results keeps raw text and JSON, one folder per run, each with its README."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# Raw results only: snapshots, traces, pages and figures are made again from these.
KEPT_SUFFIXES = {".json", ".jsonl", ".csv", ".txt", ".log", ".md", ".sh", ".yaml"}
LARGEST_FILE_BYTES = 1 << 20


def _ignored(path: Path) -> bool:
    """What .gitignore keeps out of git under benchmarks/ (`cgtool report FOLDER` writes the
    pages and figures beside a run; `--profile` the snapshots and traces)."""
    return (path.suffix in {".html", ".png", ".pickle"} or "figures" in path.parts
            or (path.name.startswith("trace_") and path.suffix == ".json"))


def _files() -> list[Path]:
    return [p for p in RESULTS.rglob("*") if p.is_file() and not _ignored(p)]


def test_there_are_results_to_check():
    assert len(_files()) > 10


def test_every_run_folder_has_a_readme():
    runs = [p for p in RESULTS.iterdir() if p.is_dir()]
    assert runs and [p.name for p in runs if not (p / "README.md").is_file()] == []


def test_results_hold_only_raw_text_and_json():
    odd = [str(p.relative_to(RESULTS)) for p in _files() if p.suffix not in KEPT_SUFFIXES]
    assert odd == []


def test_no_result_file_is_over_a_mebibyte():
    large = [str(p.relative_to(RESULTS)) for p in _files() if p.stat().st_size > LARGEST_FILE_BYTES]
    assert large == []


def _compact_results():
    spec = importlib.util.spec_from_file_location("compact_results", ROOT / "scripts" / "compact_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_json_results_are_stored_compact():
    # Indentation was a third of the results' bytes; scripts/compact_results.py takes it out
    # without changing what a file parses to.
    compact = _compact_results()
    loose = [str(p.relative_to(RESULTS)) for p in _files()
             if p.suffix == ".json" and compact.compact_text(p.read_text(encoding="utf-8")) != p.read_text(encoding="utf-8")]
    assert loose == [], "run scripts/compact_results.py"


def test_compacting_keeps_what_a_file_parses_to(tmp_path):
    compact = _compact_results()
    document = {"b": [1.5, 2e-07, None, True], "a": {"x": "→ unicode", "n": float("nan")}}
    path = tmp_path / "run" / "r.json"
    path.parent.mkdir()
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False), encoding="utf-8")
    assert compact.compact_folder(tmp_path)[0] == 1
    text = path.read_text(encoding="utf-8")
    assert "\n " not in text and list(json.loads(text)) == ["b", "a"]  # order kept
    again = json.loads(text)
    assert again["b"] == document["b"] and again["a"]["x"] == "→ unicode" and again["a"]["n"] != again["a"]["n"]
    assert compact.compact_folder(tmp_path)[0] == 0  # already compact: left alone
