"""Write a benchmark's table into a markdown file between ``<!-- NAME:start -->`` / ``<!-- NAME:end -->``."""

from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, name: str, body: str) -> None:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    block = f"{start}\n{body}\n{end}"
    if start in text and end in text:
        head, _, rest = text.partition(start)
        _, _, tail = rest.partition(end)
        text = head + block + tail
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
