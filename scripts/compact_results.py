#!/usr/bin/env python3
"""Store raw results compactly: JSON without indentation, and bulky files xz-compressed.

Benchmarks and cgtool write their documents indented, for reading. The copies kept as raw
results are read by tools and tests, and indentation made up a third of their bytes. The
rewrite keeps every key, value and order (a file parses to the same object), so a figure read
from a file is unchanged. tests/test_benchmark_results.py holds the results folder to it.

Files over 8 KiB that no test and no page reads (stage logs, per-program stamps, replay step
records, plans re-made from a profile) are kept as FILE.xz: `xz -dk FILE.xz` or `xzcat` gives
the file back byte for byte. --pack does that to the files named. So are the `verify.json`
files that tests read only through benchmarks/repredict_verify.py, which unpacks them.

    python3 scripts/compact_results.py [FOLDER ...]
    python3 scripts/compact_results.py --pack FILE ...
"""

from __future__ import annotations

import json
import lzma
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


def pack(path: Path) -> Path:
    """Replace `path` by `path.xz`, checked to give the same bytes back before the original goes."""
    data = path.read_bytes()
    packed = path.with_name(path.name + ".xz")
    packed.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    if lzma.decompress(packed.read_bytes()) != data:
        packed.unlink()
        raise OSError(f"{path}: the packed copy does not give the file back")
    path.unlink()
    return packed


def main(argv: list[str]) -> int:
    if argv[:1] == ["--pack"]:
        missing = [a for a in argv[1:] if not Path(a).is_file()]
        if missing or len(argv) == 1:
            print(f"compact_results: --pack needs files; not files: {' '.join(missing)}", file=sys.stderr)
            return 2
        for name in argv[1:]:
            pack(Path(name))
        print(f"packed {len(argv) - 1} files")
        return 0
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
