"""docs/ALGORITHMS.md documents every registered method and every one of its parameters.

For each method in ``srd_worker.methods.registry.METHODS``: a heading names it in backticks; in that
heading's section (up to the next heading of the same or a higher level) every parameter appears in
backticks and has a table row ``| `name` | type | `default` | meaning |`` whose default is the code's
default, written as ``srdq methods --json`` prints it (strings without quotes).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from srd_worker.methods.registry import METHODS

DOC = Path(__file__).resolve().parents[3] / "docs" / "ALGORITHMS.md"
_HEADING = re.compile(r"^(#{1,6})\s+(.*)$")


def format_default(value: Any) -> str:
    """A default as the docs write it: JSON for numbers, bools and None; strings as they are."""
    return value if isinstance(value, str) else json.dumps(value)


def headings(lines: list[str]) -> list[tuple[int, int, str]]:
    """(line index, level, text) of every Markdown heading outside fenced code blocks."""
    out, fenced = [], False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else _HEADING.match(line)
        if m:
            out.append((i, len(m.group(1)), m.group(2)))
    return out


def method_section(text: str, method: str) -> str:
    """The text of the one section whose heading names ``method`` in backticks."""
    lines = text.splitlines()
    heads = headings(lines)
    found = [(k, h) for k, h in enumerate(heads) if f"`{method}`" in h[2]]
    assert found, f"docs/ALGORITHMS.md has no heading naming `{method}`"
    assert len(found) == 1, f"several headings name `{method}`: {[h[2] for _, h in found]}"
    k, (start, level, _) = found[0]
    end = next((i for i, lv, _ in heads[k + 1 :] if lv <= level), len(lines))
    return "\n".join(lines[start:end])


def parameters(cls: Any) -> list[tuple[str, Any]]:
    """(name, default) of a method's parameters; ``describe()`` and the dataclass fields must agree."""
    described = [(name, default) for name, _, default, _ in cls.params.describe()]
    fields = [(f.name, f.default) for f in dataclasses.fields(cls.params)]
    assert described == fields
    return fields


def problems(section: str, params: list[tuple[str, Any]]) -> list[str]:
    """What the section lacks: a parameter not named in backticks, or without a table row giving its
    default, or with a row whose default differs from the code's."""
    out = []
    for name, default in params:
        if f"`{name}`" not in section:
            out.append(f"`{name}` not mentioned")
            continue
        rows = [line for line in section.splitlines() if re.match(rf"^\|\s*`{re.escape(name)}`\s*\|", line)]
        if not rows:
            out.append(f"`{name}` has no table row")
            continue
        want = f"`{format_default(default)}`"
        for row in rows:
            cells = [c.strip() for c in row.split("|")]
            if len(cells) < 5 or cells[3] != want:
                out.append(f"`{name}`: row says {cells[3] if len(cells) > 3 else '?'}, code says {want}")
    return out


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_and_parameter_is_documented(method: str) -> None:
    section = method_section(DOC.read_text(encoding="utf-8"), method)
    assert problems(section, parameters(METHODS[method])) == []


def test_the_checker_notices_a_missing_or_wrong_parameter() -> None:
    doc = (
        "# Methods\n\n## `demo`\n\n| parameter | type | default | meaning |\n|---|---|---|---|\n"
        "| `alpha` | float | `0.5` | kept |\n| `mode` | str | `fast` | kept |\n\n"
        "## `other`\n\n| `beta` | int | `3` | another method's |\n"
    )
    section = method_section(doc, "demo")
    assert problems(section, [("alpha", 0.5), ("mode", "fast")]) == []
    assert problems(section, [("alpha", 0.25)]) == ["`alpha`: row says `0.5`, code says `0.25`"]
    assert problems(section, [("beta", 3)]) == ["`beta` not mentioned"]
    assert problems(section, [("archive_all", False)]) == ["`archive_all` not mentioned"]
    with pytest.raises(AssertionError, match="no heading"):
        method_section(doc, "missing")


def test_defaults_are_written_as_srdq_methods_json_prints_them() -> None:
    assert [format_default(v) for v in (0.8, 50, "rank", None, False, 1.0)] == [
        "0.8",
        "50",
        "rank",
        "null",
        "false",
        "1.0",
    ]
