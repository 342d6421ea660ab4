"""benchmarks/results keeps raw text and JSON, one folder per run, each with its README."""

import importlib.util
import json
import lzma
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# Raw results only: snapshots, traces, pages and figures are made again from these.
KEPT_SUFFIXES = {".json", ".jsonl", ".csv", ".txt", ".log", ".md", ".sh", ".yaml"}
LARGEST_FILE_BYTES = 1 << 20
# Larger raw files are kept xz-compressed (scripts/compact_results.py --pack); the plain ones
# left are what tests and pages read, the largest of them a 67 KB plan.
LARGEST_PLAIN_BYTES = 96 << 10
# What a fresh clone checks out: the budget issue 35 set for the whole tracked tree.
TRACKED_TREE_BYTES = 10_000_000


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


def _raw_suffix(path: Path) -> str:
    return Path(path.stem).suffix if path.suffix == ".xz" else path.suffix


def test_results_hold_only_raw_text_and_json():
    odd = [str(p.relative_to(RESULTS)) for p in _files() if _raw_suffix(p) not in KEPT_SUFFIXES]
    assert odd == []


def test_plain_result_files_stay_small():
    large = [str(p.relative_to(RESULTS)) for p in _files()
             if p.suffix != ".xz" and p.stat().st_size > LARGEST_PLAIN_BYTES]
    assert large == [], "pack them: python3 scripts/compact_results.py --pack FILE ..."


def test_packed_results_decompress_to_their_kind():
    packed = [p for p in _files() if p.suffix == ".xz"]
    assert packed
    for path in packed:
        text = lzma.decompress(path.read_bytes()).decode("utf-8")
        if _raw_suffix(path) == ".json":
            json.loads(text)


def test_the_tracked_tree_stays_under_its_budget():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked tree is git's list")
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    paths = [ROOT / n for n in names.decode().split("\0") if n]
    total = sum(p.stat().st_size for p in paths if p.is_file())
    assert total < TRACKED_TREE_BYTES, f"{total / 1e6:.1f} MB tracked: move runs no page cites to git history"


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


def test_packing_keeps_the_bytes_and_drops_the_plain_copy(tmp_path):
    compact = _compact_results()
    path = tmp_path / "stage.log"
    data = "".join(f"12:00:{i % 60:02d} phase {i}\n" for i in range(5000)).encode()
    path.write_bytes(data)
    packed = compact.pack(path)
    assert packed.name == "stage.log.xz" and not path.exists()
    assert lzma.decompress(packed.read_bytes()) == data and packed.stat().st_size < len(data) / 5
    assert compact.main(["--pack", str(tmp_path / "absent.log")]) == 2
