"""``srdq report --html``: the report as ONE self-contained page, ``report.html``.

Everything ``report.md`` holds (the run tables with their 95% intervals, failed items, the accuracy-vs-tokens
and k-curve plots with their tables, compute per component, provenance, SRD routing statistics) plus a
per-item view: for each run, one collapsible ``<details>`` per problem with the question, the gold answer,
the chosen response and answer, the item's routing counts and every stored candidate (its reward, kept /
discarded, refined, extracted answer, grade and text).

Self-contained: inline CSS, no script, the plots embedded as base64 PNG, no URL to fetch. Every piece of
text from the store (questions, model output, errors, run ids) goes through ``esc``: ``html.escape`` after
the C0/C1 control characters other than tab and newline are written as visible ``\\xNN`` escapes (model
output holds such bytes; raw, they are invalid in HTML). Each section has a stable element id
(``SECTION_IDS``) that the browser test checks.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from srd_worker.reports.builder import (
    ANYTIME_NOTE,
    COMPONENT_NOTE,
    COMPONENT_TOKENS_NOTE,
    FAILED_NOTE,
    KCURVE_NOTE,
    NO_ANYTIME_NOTE,
    NO_KCURVE_NOTE,
    REWARD_CALLS_NOTE,
    ROUTING_NOTE,
    RUNS_NOTE,
    Figure,
    Report,
    build_report,
)
from srd_worker.reports.rows import RunRecords
from srd_worker.reports.tables import Table

#: the page's sections, in order: element id -> heading
SECTION_IDS = {
    "runs": "Runs",
    "failed": "Failed items",
    "frontier": "Accuracy vs generated tokens",
    "kcurves": "k-curves",
    "anytime": "Anytime curves",
    "compute": "Compute per component",
    "routing": "SRD routing statistics",
    "provenance": "Provenance",
    "items": "Items",
}
#: items shown per run in the per-item view (the rest: ``srdq export``), and characters of a text shown
ITEMS_PER_RUN = 200
TEXT_LIMIT = 4000

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f-\x9f]")
_CODE = re.compile(r"`([^`]+)`")
_EM = re.compile(r"\*([^*\s][^*]*)\*")

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2430;background:#f6f7f9}
header{background:#1d2a3a;color:#fff;padding:18px 28px}
header h1{margin:0 0 4px;font-size:22px}
header p{margin:0;color:#c9d3df}
header code{background:#33465c;color:#fff}
nav{padding:8px 28px;background:#e8ecf1;position:sticky;top:0;z-index:1;border-bottom:1px solid #d3d9e0}
nav a{margin-right:14px;color:#1d4f91;text-decoration:none;font-weight:600}
main{padding:8px 28px 40px;max-width:1500px}
section{background:#fff;border:1px solid #dde2e8;border-radius:6px;padding:4px 18px 14px;margin:16px 0}
h2{font-size:18px;border-bottom:1px solid #e3e7ec;padding-bottom:6px}
h3{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;margin:8px 0;font-size:13px}
th,td{border:1px solid #dde2e8;padding:3px 8px;vertical-align:top}
th{background:#f0f3f6;text-align:left;white-space:nowrap}
td.r,th.r{text-align:right;font-variant-numeric:tabular-nums}
.scroll{overflow-x:auto}
p.note{color:#4a5566;font-size:13px;max-width:1100px}
img.plot{max-width:min(100%,760px);height:auto;border:1px solid #e3e7ec;display:block;margin:8px 0}
code{background:#eef1f4;padding:0 3px;border-radius:3px}
details.item{border:1px solid #dde2e8;border-radius:4px;margin:4px 0;background:#fbfcfd}
details.item>summary{cursor:pointer;padding:4px 8px}
details.item[open]>summary{border-bottom:1px solid #dde2e8;background:#f0f3f6}
details.item>div{padding:4px 12px 10px}
pre{white-space:pre-wrap;word-break:break-word;background:#f4f6f8;border:1px solid #e3e7ec;padding:6px 8px;margin:4px 0;max-height:320px;overflow:auto;font-size:12.5px}
td pre{max-height:160px;margin:0}
.ok{color:#17803d;font-weight:600}.bad{color:#b42318;font-weight:600}.na{color:#6b7585}
tr.chosen td{background:#eef7ee}
.tag{display:inline-block;padding:0 6px;border-radius:9px;font-size:12px;background:#e8ecf1}
"""


# ---------------------------------------------------------------------------------------- text pieces
def esc(value: Any) -> str:
    """Any value as HTML text: control characters made visible (``\\x01``), then ``html.escape``."""
    text = "" if value is None else str(value)
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return html.escape(text, quote=True)


def inline(text: str) -> str:
    """A report note (Markdown inline marks ``code`` and *emphasis*) as escaped HTML."""
    out = _CODE.sub(lambda m: f"<code>{m.group(1)}</code>", esc(text))
    return _EM.sub(lambda m: f"<em>{m.group(1)}</em>", out)


def clip(text: Any, limit: int = TEXT_LIMIT) -> str:
    """At most ``limit`` characters of a text, saying how many were left out."""
    text = "" if text is None else str(text)
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… ({len(text) - limit} more characters; srdq export has them all)"


def anchor(prefix: str, key: Any) -> str:
    """An element id from free text (run ids, item ids): letters, digits, ``-`` and ``_`` only."""
    return prefix + "-" + (re.sub(r"[^A-Za-z0-9_-]+", "_", str(key)) or "_")


def table_html(table: Table, *, cls: str = "") -> str:
    align = table.align or "l" + "r" * (len(table.headers) - 1)
    klass = ["l" if a == "l" else "r" for a in align]
    head = "".join(f'<th class="{k}">{esc(h)}</th>' for h, k in zip(table.headers, klass, strict=False))
    body = "".join(
        "<tr>" + "".join(f'<td class="{k}">{esc(c)}</td>' for c, k in zip(row, klass, strict=False)) + "</tr>"
        for row in table.rows
    )
    attr = f' class="{cls}"' if cls else ""
    return (
        f'<div class="scroll"><table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
    )


def image_html(path: Path, alt: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img class="plot" alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def _note(text: str) -> str:
    return f'<p class="note">{inline(text)}</p>'


def _figure(fig: Figure, level: str = "h3") -> str:
    parts = [f"<{level}>{inline(fig.title)}</{level}>"]
    if fig.path is not None:
        parts.append(image_html(fig.path, fig.alt))
    else:  # matplotlib (the plots extra) not installed: the table below holds the numbers
        parts.append(_note("Plot skipped: matplotlib (srdq's plots extra) is not installed here."))
    if fig.caption:
        parts.append(_note(fig.caption))
    parts.append(table_html(fig.table))
    return "\n".join(parts)


def _grade(correct: Any, error: Any = None) -> str:
    if error:
        return '<span class="bad">failed</span>'
    if correct is None:
        return '<span class="na">ungraded</span>'
    return '<span class="ok">correct</span>' if correct else '<span class="bad">wrong</span>'


def _code(value: Any, limit: int = 400) -> str:
    """A short value (an answer, a gold answer, an id) as ``<code>``; ``–`` when there is none."""
    if value is None or str(value) == "":
        return '<span class="na">–</span>'
    return f"<code>{esc(clip(value, limit))}</code>"


def _num(value: Any, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if isinstance(value, int | float) and not isinstance(value, bool) else "–"


# ------------------------------------------------------------------------------------ per-item view
def _candidates(record: dict[str, Any]) -> str:
    cands = record.get("candidates")
    if not cands:
        return '<p class="note">No candidates stored for this item (the method keeps none, or keep_candidates=none).</p>'
    chosen = (record.get("extra") or {}).get("chosen")
    rows = []
    for c in cands:
        is_chosen = chosen is not None and c.get("id") == chosen
        status = c.get("status") or "–"
        refined = {True: "yes", False: "no"}.get(c.get("refined"), "–")
        text = c.get("text")
        rows.append(
            f'<tr class="{"chosen" if is_chosen else ""}">'
            f'<td class="r">{esc(c.get("id"))}{" ★" if is_chosen else ""}</td>'
            f'<td class="r">{_num(c.get("reward"))}</td>'
            f"<td>{esc(status)}</td><td>{esc(refined)}</td>"
            f"<td>{_code(c.get('answer'), 80)}</td><td>{_grade(c.get('correct'))}</td>"
            f'<td class="r">{esc(c.get("n_tokens", "–"))}</td><td>{esc(c.get("finish") or "–")}</td>'
            f"<td>{'<pre>' + esc(clip(text)) + '</pre>' if text is not None else '<span class=na>not kept</span>'}</td>"
            "</tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("id", "reward", "routing", "refined", "answer", "grade", "tokens", "finish", "text")
    )
    return (
        f'<div class="scroll"><table class="candidates"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
        '<p class="note">★ = the candidate the method chose; <em>routing</em> = kept / discarded at the end '
        "(SRD family), <em>refined</em> = went through at least one edit.</p>"
    )


def _routing(extra: dict[str, Any]) -> str:
    routing = extra.get("routing")
    if not isinstance(routing, dict):
        return ""
    counts = ", ".join(f"{esc(k)} {esc(v)}" for k, v in routing.items())
    tiers = " · ".join(f"{name} {_num(extra.get(name))}" for name in ("p_H", "p_M", "p_L") if name in extra)
    refs = extra.get("refinements")
    kept = extra.get("refine_kept")
    more = f" · refinements {esc(refs)} (kept {esc(kept)})" if refs is not None else ""
    return f'<p><span class="tag">routing</span> {counts}{" · " + tiers if tiers else ""}{more}</p>'


def _item(run: RunRecords, record: dict[str, Any]) -> str:
    extra = record.get("extra") or {}
    pos = record.get("position")
    error = record.get("error")
    head = (
        f"#{esc(pos)} {_code(record.get('item_id'), 80)} — {_grade(record.get('correct'), error)}"
        f" · answer {_code(record.get('answer'), 80)} · gold {_code(record.get('gold'), 80)}"
        f" · reward {_num(record.get('reward'))}"
    )
    body = [
        "<h4>Question</h4>",
        f"<pre>{esc(clip(record.get('question')))}</pre>",
        f"<p>Gold answer: {_code(record.get('gold'))}</p>",
    ]
    if error:
        body += ["<h4>Error</h4>", f"<pre>{esc(clip(error))}</pre>"]
    else:
        body += [
            f"<h4>Chosen response (answer {_code(record.get('answer'))}, "
            f"{_grade(record.get('correct'))}, reward {_num(record.get('reward'))}, "
            f"finish {esc(record.get('finish_reason') or '–')})</h4>",
            f"<pre>{esc(clip(record.get('response')))}</pre>",
            _routing(extra),
            "<h4>Candidates</h4>",
            _candidates(record),
        ]
    return (
        f'<details class="item" id="{anchor("item-" + run.run_id, pos)}"><summary>{head}</summary>'
        f"<div>{''.join(body)}</div></details>"
    )


def items_html(runs: Sequence[RunRecords], limit: int = ITEMS_PER_RUN) -> str:
    parts = []
    for run in runs:
        shown = run.records[:limit]
        more = (
            f" (the first {limit} of {len(run.records)}; <code>srdq export</code> has them all)"
            if len(run.records) > limit
            else ""
        )
        parts.append(
            f'<h3 id="{anchor("items", run.run_id)}"><code>{esc(run.run_id)}</code> ({esc(run.method)}): '
            f"{len(run.records)} item(s){more}</h3>"
        )
        parts += [_item(run, r) for r in shown]
        if not shown:
            parts.append('<p class="note">No results yet.</p>')
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------- the page
def render_html(runs: Sequence[RunRecords], report: Report) -> str:
    """The page for ``runs`` from the tables and figures ``build_report`` made (``report``)."""
    sec: dict[str, list[str]] = {key: [] for key in SECTION_IDS}
    for reward, table in report.run_tables:
        if reward is not None:
            sec["runs"].append(f"<h3>Reward <code>{esc(reward)}</code></h3>")
        sec["runs"].append(table_html(table, cls="summary"))
    sec["runs"].append(_note(RUNS_NOTE))
    if report.failed is not None:
        sec["failed"] += [table_html(report.failed), _note(FAILED_NOTE)]
    else:
        sec["failed"].append('<p class="note">No item failed.</p>')
    sec["frontier"] += [_figure(f) for f in report.frontiers] or [
        '<p class="note">No run has graded items or rewards yet: nothing to plot.</p>'
    ]
    sec["kcurves"] += [_figure(f) for f in report.kcurves]
    sec["kcurves"].append(_note(KCURVE_NOTE if report.kcurves else NO_KCURVE_NOTE))
    sec["anytime"] += [_figure(f) for f in report.anytime]
    sec["anytime"].append(_note(ANYTIME_NOTE if report.anytime else NO_ANYTIME_NOTE))
    if report.components is not None and report.component_tokens is not None:
        sec["compute"] += [
            table_html(report.components),
            _note(COMPONENT_NOTE),
            _note(COMPONENT_TOKENS_NOTE),
            table_html(report.component_tokens),
        ]
        if report.reward_calls is not None:
            sec["compute"] += [_note(REWARD_CALLS_NOTE), table_html(report.reward_calls)]
    else:
        sec["compute"].append('<p class="note">No compute ledger in these runs.</p>')
    if report.routing is not None:
        sec["routing"] += [table_html(report.routing), _note(ROUTING_NOTE)]
    else:
        sec["routing"].append(
            '<p class="note">No run here records routing statistics (only SRD-family methods do).</p>'
        )
    if report.provenance is not None:
        sec["provenance"].append(table_html(report.provenance))
    sec["items"] += [
        '<p class="note">One entry per problem (click to open): the question, the gold answer, the chosen '
        "response, the item's routing counts (SRD family) and every stored candidate.</p>",
        items_html(runs),
    ]
    runs_line = ", ".join(f"<code>{esc(r.run_id)}</code> ({esc(r.method)})" for r in runs)
    nav = "".join(f'<a href="#{key}">{esc(title)}</a>' for key, title in SECTION_IDS.items())
    sections = "\n".join(
        f'<section id="{key}"><h2>{esc(SECTION_IDS[key])}</h2>\n' + "\n".join(parts) + "\n</section>"
        for key, parts in sec.items()
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>srdq report: {esc(', '.join(r.run_id for r in runs))}</title>"
        f"<style>{CSS}</style></head>\n<body>\n"
        f"<header><h1>srdq report</h1><p>{len(runs)} run(s): {runs_line}. Generated "
        f"{esc(report.generated)}.</p></header>\n<nav>{nav}</nav>\n<main>\n{sections}\n</main>\n</body></html>\n"
    )


def build_html_report(
    runs: Sequence[RunRecords], out_dir: str | Path, *, now: datetime | None = None
) -> tuple[Report, Path]:
    """``build_report`` (report.md and its PNGs in ``out_dir``), then ``report.html`` beside them: the
    same report with the plots embedded, so the page alone can be moved or mailed."""
    report = build_report(runs, out_dir, now=now)
    path = Path(out_dir) / "report.html"
    # errors="replace": a lone surrogate in stored text must not stop the page
    path.write_text(render_html(runs, report), encoding="utf-8", errors="replace")
    return report, path
