"""Photograph the console for docs/console.md.

Builds the showcase the browser test also loads (tests/console_scene.py)
into a temporary directory, starts ``reliable-flow console`` on it (once
read only, once with ``--allow-actions`` for the action form), and saves a
PNG of each page of ``console_scene.PAGES`` here, taken by Debian's headless
chromium through chromedriver at a fixed window size.  From the repository
root::

    PYTHONPATH=src python docs/console/screenshots.py

Needs selenium, chromium and chromedriver (as tests/test_console_browser.py).
Each page is checked for its words before it is photographed, so a picture
of an error page is refused rather than saved.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "tests"))  # the scenario lives with the tests that check it

import console_scene as scene

WINDOW = (1200, 800)
CHART_SECONDS = 7


@contextmanager
def served(where: Path, *extra: str) -> Iterator[str]:
    """``reliable-flow console producer.db consumer.db --port 0 EXTRA`` in ``where``: its URL, stopped after."""
    # run in ``where`` with relative names, so the pages show "producer.db", not a temporary path
    proc = subprocess.Popen([sys.executable, "-m", "reliable_flow", "console", "producer.db", "consumer.db",
                             "--port", "0", *extra], stdout=subprocess.PIPE, text=True, cwd=where)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if " on http://" not in line:
            raise SystemExit(f"the console did not start: {line!r}")
        yield line.split(" on ", 1)[1].split(" ", 1)[0]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def chromium(profile: Path) -> Iterator[Any]:
    """Headless chromium at :data:`WINDOW`, quit after."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run",
                 "--disable-extensions", "--hide-scrollbars", f"--window-size={WINDOW[0]},{WINDOW[1]}",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.set_page_load_timeout(20)
        yield driver
    finally:
        driver.quit()


def shoot(driver: Any, url: str, name: str, words: tuple[str, ...]) -> None:
    """Load ``url``, check it shows ``words``, save ``<name>.png`` here."""
    driver.get(url)
    if name == "overview":
        time.sleep(CHART_SECONDS)  # the page refreshes itself, and the chart gathers points as it does
    text = driver.find_element("tag name", "body").text
    missing = [word for word in words if word not in text]
    if missing:
        raise SystemExit(f"{url} does not show {missing}:\n{text[:1000]}")
    driver.save_screenshot(str(HERE / f"{name}.png"))
    print(f"{name}.png  {url}")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="console-shots-") as tmp:
        where = Path(tmp)
        scene.build(str(where / "producer.db"), str(where / "consumer.db"))
        with chromium(where / "profile") as driver:
            with served(where) as url:
                for name, path, words in scene.PAGES:
                    shoot(driver, url + path, name, words)
            with served(where, "--allow-actions") as url:
                driver.get(url + scene.PAGES[5][1])  # the dead effect, now with its action links
                driver.find_element("link text", "retry").click()
                shoot(driver, driver.current_url, "action-retry", ("Retry an effect", "effect key", "reason"))


if __name__ == "__main__":
    main()
