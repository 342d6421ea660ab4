#!/usr/bin/env python3
"""Rewrite the JSON files under benchmarks/results (or the folders named) without indentation.

Benchmarks and cgtool write their documents indented, for reading. The copies kept as raw
results are read by tools and tests, and indentation made up a third of their bytes. The
rewrite keeps every key, value and order (a file parses to the same object), so a figure read
from a file is unchanged. tests/test_results_tree.py holds the results folder to it.

    python3 scripts/compact_results.py [FOLDER ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def compact_text(text: str) -> str:
    """The same JSON document without whitespace between tokens, ending in a newline."""
    return json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False) + "\n"


def compact_folder(folder: Path) -> tuple[int, int, int]:
    """(files rewritten, bytes before, bytes after) for the JSON files below `folder`."""
    rewritten = before = after = 0
    for path in sorted(folder.rglob("*.json")):
        text = path.read_text(encoding="utf-8")
        compacted = compact_text(text)
        before += len(text.encode())
        after += len(compacted.encode())
        if compacted != text:
            path.write_text(compacted, encoding="utf-8")
            rewritten += 1
    return rewritten, before, after


def main(argv: list[str]) -> int:
    folders = [Path(a) for a in argv] or [RESULTS]
    for folder in folders:
        if not folder.is_dir():
            print(f"compact_results: {folder} is not a folder", file=sys.stderr)
            return 2
        rewritten, before, after = compact_folder(folder)
        print(f"{folder}: {rewritten} files rewritten, {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
