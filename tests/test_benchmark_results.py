"""benchmarks/results keeps raw text and JSON, one folder per run, each with its README."""

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
