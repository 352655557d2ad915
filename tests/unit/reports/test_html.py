"""``srdq report --html``: one self-contained page, escaped, with every section; loaded in a real headless
Chromium (Debian's ``chromium`` + ``chromium-driver``) with no console error. The report is of two real
embedded runs (``srdq run`` with the tiny random Llama, Best-of-N and SRD) on three GSM8K problems, one
problem whose text is HTML markup and one whose prompt does not fit the model's context (a failed item).

``SRDQ_DOCS_SCREENSHOTS=docs`` makes the browser test also write ``docs/report_html.png`` and
``docs/report_html_items.png``, the screenshots the README shows."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from srd_worker.reports.html import SECTION_IDS, build_html_report, esc, inline
from srd_worker.reports.rows import RunRecords
from tests.browser import browser_missing, headless_chromium, load_page
from tests.unit.reports.test_reports import RUN_ARGS, bon_run, srd_run, srdq

HOSTILE = 'What is 3 + 4? <script>alert("x")</script> </details></pre><img src=x onerror=alert(1)> & done'
LONG = "Count the apples in the basket again and again. " * 150  # > 2048 tokens: does not fit


def _attrs(page: str) -> list[tuple[str, str]]:
    return re.findall(r'\b(src|href)\s*=\s*"([^"]*)"', page)


# ----------------------------------------------------------------------------------- pure rendering
def test_text_is_escaped_and_control_characters_are_made_visible() -> None:
    assert esc('<a href="x">&\x01\x1b\x7f') == "&lt;a href=&quot;x&quot;&gt;&amp;\\x01\\x1b\\x7f"
    assert esc("line\n\ttab") == "line\n\ttab"
    assert esc(None) == ""
    assert inline("see `a<b>` and *c*") == "see <code>a&lt;b&gt;</code> and <em>c</em>"


def test_a_page_from_hand_made_records_has_every_section_and_escapes_the_items(tmp_path: Path) -> None:
    srd = srd_run()
    srd.records[0]["question"] = HOSTILE
    srd.records[0]["extra"]["chosen"] = 1
    srd.records[0]["candidates"] = [
        {"id": 0, "text": "</td></tr><b>bold</b>", "reward": 0.25, "status": "discarded", "refined": True},
        {"id": 1, "text": "7", "reward": 0.9, "status": "kept", "refined": False, "answer": "7"},
    ]
    bon = bon_run()
    _, path = build_html_report([bon, srd], tmp_path)
    page = path.read_text(encoding="utf-8")
    for key in SECTION_IDS:
        assert page.count(f'<section id="{key}">') == 1
    assert "<script" not in page and "<b>bold</b>" not in page and "<img src=x" not in page
    assert esc(HOSTILE) in page and "&lt;/td&gt;&lt;/tr&gt;&lt;b&gt;bold&lt;/b&gt;" in page
    assert all(v.startswith(("#", "data:image/png;base64,")) for _, v in _attrs(page)), _attrs(page)
    # the chosen candidate is marked, routing counts and statuses are shown
    srd_items = page.split('id="items-run-srd"')[1]
    assert '<tr class="chosen"><td class="r">1 ★</td>' in srd_items
    assert (
        '<span class="tag">routing</span> keep 3, refine 1, discard 0 · refinements 1 (kept 1)' in srd_items
    )
    assert "keep 2, refine 1, discard 3 · refinements 2 (kept 1)" in srd_items
    assert "discarded" in srd_items and "kept" in srd_items
    # the failed item of bon_run is listed with its error, in its section and in the item view
    failed = page.split('<section id="failed">')[1].split("</section>")[0]
    assert "does not fit the model context of 2048" in failed
    assert page.count('<details class="item"') == len(bon.records) + len(srd.records)


def test_a_page_with_no_runs_worth_plotting_still_has_every_section(tmp_path: Path) -> None:
    empty = RunRecords(
        run_id="run-empty",
        name="e",
        spec={"method": "srd"},
        status="running",
        n_items=3,
        wall_s=None,
        records=[],
    )
    _, path = build_html_report([empty], tmp_path)
    page = path.read_text(encoding="utf-8")
    assert all(f'<section id="{key}">' in page for key in SECTION_IDS)
    assert "nothing to plot" in page and "No results yet." in page and "data:image/png" not in page


def test_long_texts_are_clipped_with_a_note(tmp_path: Path) -> None:
    run = bon_run()
    run.records[0]["response"] = "x" * 10_000
    _, path = build_html_report([run], tmp_path)
    page = path.read_text(encoding="utf-8")
    assert "x" * 4000 + "\n… (6000 more characters; srdq export has them all)" in page
    assert "x" * 4001 not in page


# ------------------------------------------------------------------------------ real embedded runs
@pytest.fixture(scope="module")
def html_runs(tmp_path_factory, datasets_dir) -> tuple[Path, list[str]]:
    """Best-of-N and SRD on 3 GSM8K problems + one written in HTML + one too long for the context."""
    base = tmp_path_factory.mktemp("html")
    data = base / "gsm8k_html.jsonl"
    rows = (datasets_dir / "gsm8k_test.jsonl").read_text(encoding="utf-8").splitlines()[:3]
    rows.append(json.dumps({"question": HOSTILE, "answer": "3 + 4 = <<3+4=7>>7\n#### 7"}))
    rows.append(json.dumps({"question": LONG, "answer": "#### 5"}))
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = base / "out"
    run_ids = []
    for method in ("best_of_n", "srd"):
        proc = srdq("run", str(data), "--method", method, *RUN_ARGS, "--out", str(out))
        assert proc.returncode == 0, proc.stderr
        (summary,) = [
            p for p in out.glob("run-*/summary.json") if json.loads(p.read_text())["method"] == method
        ]
        run_ids.append(json.loads(summary.read_text())["run_id"])
    return out, run_ids


@pytest.fixture(scope="module")
def html_page(html_runs, tmp_path_factory) -> tuple[Path, list[str]]:
    out, run_ids = html_runs
    rep = tmp_path_factory.mktemp("rep")
    proc = srdq("report", *run_ids, "--out", str(rep), "--db", str(out), "--html")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == str(rep / "report.md")
    assert proc.stdout.split()[-1] == str(rep / "report.html")
    return rep / "report.html", run_ids


@pytest.mark.e2e
def test_html_report_of_real_runs_is_one_self_contained_escaped_page(html_page) -> None:
    path, run_ids = html_page
    page = path.read_text(encoding="utf-8")
    attrs = _attrs(page)
    images = [v for k, v in attrs if k == "src"]
    assert len(images) == 3 and all(
        v.startswith("data:image/png;base64,") for v in images
    )  # frontier, Best-of-N's k-curve, SRD's anytime curve
    assert all(v.startswith("#") for k, v in attrs if k == "href")  # in-page links only
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert esc(HOSTILE) in page
    assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", page)  # model output's control bytes escaped
    for run_id in run_ids:
        assert f'id="items-{run_id}"' in page


@pytest.mark.e2e
def test_html_report_loads_in_headless_chromium_without_console_errors(html_page, tmp_path: Path) -> None:
    if (missing := browser_missing()) is not None:
        pytest.skip(missing)
    from PIL import Image
    from selenium.webdriver.common.by import By

    path, run_ids = html_page
    bon_id, srd_id = run_ids
    with headless_chromium() as driver:
        console = load_page(driver, path)
        assert [e for e in console if e["level"] in ("SEVERE", "WARNING")] == []
        assert driver.title.startswith("srdq report: ")
        for key, title in SECTION_IDS.items():
            section = driver.find_element(By.ID, key)
            assert section.is_displayed()
            assert section.find_element(By.TAG_NAME, "h2").text == title
        # nothing fetched: the plots are inline, there is no script, stylesheet or font to load
        assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0
        assert driver.execute_script("return document.scripts.length") == 0
        sizes = driver.execute_script(
            "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])"
        )
        assert len(sizes) == 3 and all(ok and w > 500 and h > 300 for ok, w, h in sizes), sizes
        # tables with intervals, the failed item, SRD routing only for the SRD run
        runs_text = driver.find_element(By.ID, "runs").text
        assert bon_id in runs_text and srd_id in runs_text and "accuracy 95% CI" in runs_text
        failed = driver.find_element(By.ID, "failed").text
        assert "does not fit the model context of 2048" in failed and bon_id in failed
        routing = driver.find_element(By.ID, "routing").text
        assert srd_id in routing and bon_id not in routing
        assert driver.find_element(By.ID, "kcurves").find_elements(By.CSS_SELECTOR, "img.plot")
        anytime = driver.find_element(By.ID, "anytime")
        assert anytime.find_elements(By.CSS_SELECTOR, "img.plot") and srd_id in anytime.text
        assert "tiny-random-llama" in driver.find_element(By.ID, "provenance").text
        # per-item view: 5 problems per run; the HTML-looking question is shown as text, not markup
        for run_id in run_ids:
            heading = driver.find_element(By.ID, f"items-{run_id}")
            assert "5 item(s)" in heading.text
        items = driver.find_elements(By.CSS_SELECTOR, "details.item")
        assert len(items) == 10
        hostile = driver.find_element(By.ID, f"item-{srd_id}-3")
        assert hostile.get_attribute("open") is None
        hostile.find_element(By.TAG_NAME, "summary").click()
        assert hostile.get_attribute("open") is not None
        assert HOSTILE in hostile.find_element(By.TAG_NAME, "pre").text
        cands = hostile.find_elements(By.CSS_SELECTOR, "table.candidates tbody tr")
        assert cands and any("★" in row.text for row in cands)
        assert "routing" in hostile.text
        too_long = driver.find_element(By.ID, f"item-{bon_id}-4").text
        assert "failed" in too_long and "gold 5" in too_long, too_long
        driver.execute_script("window.scrollTo(0, 0)")
        top = tmp_path / "report_html.png"
        driver.save_screenshot(str(top))
        driver.execute_script("arguments[0].scrollIntoView()", hostile)
        item_shot = tmp_path / "report_html_items.png"
        driver.save_screenshot(str(item_shot))
        console = driver.get_log("browser")
        assert [e for e in console if e["level"] in ("SEVERE", "WARNING")] == []
    for shot in (top, item_shot):
        with Image.open(shot) as image:
            assert image.format == "PNG" and image.width >= 1000 and image.height >= 1000
            colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
            assert colours is not None and len(colours) > 50  # a rendered page, not a blank one
    if docs := os.environ.get("SRDQ_DOCS_SCREENSHOTS"):
        for shot in (top, item_shot):
            shutil.copyfile(shot, Path(docs) / shot.name)
