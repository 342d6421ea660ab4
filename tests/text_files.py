"""Writing the small source files that reader and converter tests parse."""

from __future__ import annotations

from pathlib import Path


def write_text(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def write_lines(folder: Path, lines: list[str], name: str = "t.jsonl") -> Path:
    return write_text(folder, name, "".join(line + "\n" for line in lines))
