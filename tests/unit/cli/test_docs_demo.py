"""The README's demo table is the one the demo wrote: `make demo-docs` writes docs/demo_table.md (what
`srd_worker.testbed.demo` prints), and the README quotes that file in the fenced block after "printed"."""

from __future__ import annotations

from tests.conftest import ROOT


def test_readme_demo_block_is_the_file_the_demo_wrote() -> None:
    written = (ROOT / "docs" / "demo_table.md").read_text(encoding="utf-8").strip()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Two commands") : readme.index("## Using srdq on one machine")]
    blocks, current = [], None
    for line in section.splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current).strip())
                current = None
        elif current is not None:
            current.append(line)
    assert written in blocks, "README's demo table differs from docs/demo_table.md (make demo-docs)"
