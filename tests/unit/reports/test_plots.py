"""The figures' titles: matplotlib cuts a long title off at the figure's edge, so plots wrap it."""

from __future__ import annotations

from pathlib import Path

import pytest

from srd_worker.reports.plots import TITLE_WIDTH, plot_frontier, wrap_title
from srd_worker.reports.rows import Point

LONG = (
    "GSM8K, qwen2.5-coder-0.5b: accuracy vs generated tokens, reward judge:qwen2.5-coder-1.5b at "
    "Δ = 256 tokens"
)


def test_wrap_title_breaks_long_lines_at_spaces_and_keeps_every_word_and_line_break() -> None:
    title = LONG + "\n200 problems × 2 seeds; 95% intervals"
    wrapped = wrap_title(title)
    lines = wrapped.split("\n")
    assert len(lines) == 3 and all(len(line) <= TITLE_WIDTH for line in lines)
    assert wrapped.split() == title.split()  # the same words, in order
    assert lines[-1] == "200 problems × 2 seeds; 95% intervals"  # a given line break stays one
    assert wrap_title("short") == "short" and wrap_title("") == ""
    word = "x" * (TITLE_WIDTH + 10)
    assert wrap_title(f"a {word} b") == f"a\n{word}\nb"  # a word longer than a line is not cut


def test_a_long_frontier_title_fits_inside_the_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from matplotlib.figure import Figure

    drawn: list[Figure] = []
    save = Figure.savefig

    def keep(self: Figure, *args, **kwargs):
        drawn.append(self)
        return save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    point = Point(
        dataset="gsm8k",
        metric="accuracy",
        method="best_of_n",
        budget=4,
        run_id="run-a",
        x=1200.0,
        y=0.3,
        x_ci=(1100.0, 1300.0),
        y_ci=(0.25, 0.35),
    )
    path = plot_frontier([point], tmp_path / "f.png", title=LONG, subtitle="200 problems × 2 seeds")
    assert path.exists()
    (fig,) = drawn
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    title = fig.axes[0].title
    box, frame = title.get_window_extent(renderer), fig.bbox
    assert title.get_text().count("\n") >= 2  # the title was broken, not one line
    assert frame.x0 <= box.x0 and box.x1 <= frame.x1  # and no part of it lies outside the figure
