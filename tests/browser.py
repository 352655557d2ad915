"""A real headless Chromium (Debian's ``chromium`` + ``chromium-driver``) driven by selenium, for the tests
that load a page srdq writes (``srdq report --html``). ``browser_missing()`` names what is absent so a test
can skip with that reason; nothing is downloaded (selenium is given the driver's path, so its own driver
manager never runs)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = ("chromedriver",)


def _which(names: tuple[str, ...], env: str) -> str | None:
    if os.environ.get(env):
        return os.environ[env]
    return next((p for name in names if (p := shutil.which(name))), None)


def browser_missing() -> str | None:
    """None when a Chromium, its driver and selenium are here; else what is missing (a skip reason)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if _which(CHROMIUM, "SRDQ_CHROMIUM") is None:
        return "no chromium browser (apt-get install chromium chromium-driver; make test installs it as root)"
    if _which(DRIVER, "SRDQ_CHROMEDRIVER") is None:
        return "no chromedriver (apt-get install chromium-driver)"
    return None


@contextmanager
def headless_chromium(width: int = 1280, height: int = 1600) -> Iterator[Any]:
    """A selenium WebDriver on headless Chromium that keeps the page's console (``get_log('browser')``);
    quit (browser process included) on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(_which(CHROMIUM, "SRDQ_CHROMIUM"))
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespaces for the sandbox
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(str(_which(DRIVER, "SRDQ_CHROMEDRIVER"))))
    try:
        driver.set_page_load_timeout(60)
        yield driver
    finally:
        driver.quit()


def load_page(driver: Any, path: Path) -> list[dict[str, Any]]:
    """Open a local file and return the console entries it produced (errors, warnings, logs)."""
    driver.get(Path(path).resolve().as_uri())
    driver.execute_script("return document.readyState")
    return list(driver.get_log("browser"))
