"""The console in a real browser: Debian's chromium, headless, driven by
selenium through Debian's chromedriver, against ``reliable-flow console``
running as a child process, as an operator would start it.

Each page of the showcase (tests/console_scene.py, the scenario
docs/console/screenshots.py photographs) is loaded and its content
checked, once more with JavaScript off; the overview is seen to refresh by
itself after an event is committed.  Without chromium (or
selenium) the tests skip, except under ``RELIABLE_FLOW_REQUIRE_BROWSER=1``
(``.ci/run`` sets it), where they fail.  The browser, its driver and the
server are stopped also when the run is interrupted (tests/cleanup.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

import cleanup
import console_scene as scene
from reliable_flow import Consumer, Producer
from reliable_flow.reservation import RESERVATION
from support import child_env

pytestmark = pytest.mark.browser

#: Where chromium is looked for; RELIABLE_FLOW_CHROMIUM names another one (a test of the failure, say).
CHROMIUM = (os.environ.get("RELIABLE_FLOW_CHROMIUM") or "/usr/bin/chromium", "chromium", "chromium-browser")
CHROMEDRIVER = ("/usr/bin/chromedriver", "chromedriver")


def _unavailable(why: str) -> None:
    """Skip for want of the browser, or fail when it is required."""
    if os.environ.get("RELIABLE_FLOW_REQUIRE_BROWSER"):
        pytest.fail(f"the browser test cannot start, and RELIABLE_FLOW_REQUIRE_BROWSER is set: {why}")
    pytest.skip(f"no browser (headless chromium): {why}")


def _found(names: tuple[str, ...]) -> str | None:
    if names is CHROMIUM and os.environ.get("RELIABLE_FLOW_CHROMIUM"):
        names = names[:1]  # that one, or none
    for name in names:
        path = name if os.path.isabs(name) and os.access(name, os.X_OK) else shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The showcase (tests/console_scene.py): a flow applied, one at a gap, one blocked, a dead effect."""
    where = tmp_path_factory.mktemp("console")
    stores = str(where / "producer.db"), str(where / "consumer.db")
    scene.build(*stores)
    return stores


def _stop_process(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def console(stores: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``reliable-flow console PRODUCER CONSUMER --port 0``: its URL."""
    yield from _served(stores, tmp_path_factory)


@pytest.fixture(scope="module")
def acting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """``reliable-flow console ... --allow-actions`` on stores of its own: its URL and the stores."""
    where = tmp_path_factory.mktemp("acting")
    stores = str(where / "producer.db"), str(where / "consumer.db")
    scene.build(*stores)
    for url in _served(stores, tmp_path_factory, "--allow-actions"):
        yield url, *stores


def _served(stores: tuple[str, str], tmp_path_factory: pytest.TempPathFactory, *extra: str) -> Iterator[str]:
    producer, consumer = stores
    proc = subprocess.Popen([sys.executable, "-m", "reliable_flow", "console", producer, consumer, "--port", "0",
                             *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                            cwd=tmp_path_factory.mktemp("cwd"))
    cleanup.register(proc, lambda: _stop_process(proc))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert " on http://" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        yield line.split(" on ", 1)[1].split(" ", 1)[0]
        proc.send_signal(signal.SIGTERM)  # as an operator's service manager stops it
        _, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
    finally:
        _stop_process(proc)
        cleanup.forget(proc)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Headless chromium, JavaScript on."""
    yield from _chromium(tmp_path_factory, javascript=True)


@pytest.fixture(scope="module")
def no_script(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Headless chromium with JavaScript off, as a locked-down operator's browser may be."""
    yield from _chromium(tmp_path_factory, javascript=False)


def _chromium(tmp_path_factory: pytest.TempPathFactory, *, javascript: bool) -> Iterator[Any]:
    try:
        from selenium import webdriver
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        _unavailable(f"selenium is not installed ({exc})")
    chromium, driver_path = _found(CHROMIUM), _found(CHROMEDRIVER)
    if chromium is None or driver_path is None:
        _unavailable(f"chromium: {chromium}, chromedriver: {driver_path} (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--no-first-run", "--disable-extensions", "--window-size=1280,900",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(flag)
    if not javascript:
        # as an administrator's policy turns it off (2: blocked on every site)
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    # its own session, so that chromium (the driver's child) goes with it on a kill of the group
    service = Service(driver_path, popen_kw={"start_new_session": True})
    try:
        driver = webdriver.Chrome(service=service, options=options)
    except WebDriverException as exc:
        _stop_service(service)
        _unavailable(f"chromium did not start: {exc.msg}")

    def stop() -> None:
        try:
            driver.quit()
        finally:
            _stop_service(service)

    cleanup.register(driver, stop)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        stop()
        cleanup.forget(driver)


def _stop_service(service: Any) -> None:
    """The driver and everything it started, gone (its process group)."""
    process = getattr(service, "process", None)
    if process is not None and process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=10)


def _text(driver: Any) -> str:
    return str(driver.find_element("tag name", "body").text)


def _produced(driver: Any) -> str:
    """The overview's event count (its ``<main>`` may be swapped while read)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return str(driver.find_element("id", "produced").text)
    except (StaleElementReferenceException, NoSuchElementException):
        return ""


def test_every_page_shows_its_content(browser: Any, console: str) -> None:
    for _, path, words in scene.PAGES:
        browser.get(console + path)
        text = _text(browser)
        assert all(word in text for word in words), (path, [w for w in words if w not in text], text[:2000])
    browser.get(console)
    assert browser.title == "Overview - reliable_flow console"
    assert f"{scene.EVENTS} events in {scene.FLOWS} flows" in _text(browser)
    assert browser.find_element("css selector", "svg.chart") is not None

    search = browser.find_element("name", "q")
    search.send_keys(scene.DEAD)
    search.submit()
    assert "effect_key" in _text(browser)
    browser.find_element("link text", scene.APPLIED).click()
    flow = _text(browser)
    assert browser.title == f"Flow {scene.APPLIED} - reliable_flow console"
    assert "Why it waits: nothing waits: applied up to seq 3" in flow and "mail relay refused" in flow

    browser.find_element("link text", scene.DEAD).click()
    effect = _text(browser)
    assert "notify of consumer default: dead" in effect and "scheduled" in effect and "claimed" in effect

    browser.get(console + "effects?state=dead")
    assert scene.DEAD in _text(browser) and f"default:{scene.GAP}-1:notify" not in _text(browser)
    browser.get(console + "metrics")
    assert "reliable_flow_" in _text(browser)
    browser.get(console + "api/effects/" + scene.DEAD.replace(":", "%3A"))
    assert '"transition": "claimed"' in _text(browser)  # the JSON twin
    browser.get(console + "flows/nothing-here")
    assert "404 Not Found" in _text(browser) and "no flow 'nothing-here'" in _text(browser)


def test_without_javascript_every_page_shows_its_content(no_script: Any, console: str) -> None:
    no_script.get("data:text/html,<title>off</title><script>document.title = 'on'</script>")
    assert no_script.title == "off"  # it is really off
    for _, path, words in scene.PAGES:
        no_script.get(console + path)
        text = _text(no_script)
        assert all(word in text for word in words), (path, [w for w in words if w not in text], text[:2000])
    no_script.get(console)
    search = no_script.find_element("name", "q")  # a plain form: it works without a script
    search.send_keys(scene.BLOCKED)
    search.submit()
    no_script.find_element("link text", scene.BLOCKED).click()
    assert "Why it waits: blocked: unsupported_schema" in _text(no_script)
    no_script.find_element("link text", "Effects").click()
    assert scene.DEAD in _text(no_script)


def test_the_overview_refreshes_by_itself(browser: Any, console: str, stores: tuple[str, str]) -> None:
    browser.get(console)
    assert f"{scene.EVENTS} events in {scene.FLOWS} flows" in _produced(browser)
    browser.execute_script("window.notReloaded = true;")
    with Producer(stores[0], RESERVATION) as producer:
        producer.advance("new-1", "new", expected_seq=0, kind="reserved", payload={"amount": 1})
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if f"{scene.EVENTS + 1} events in {scene.FLOWS + 1} flows" in _produced(browser):
            break
        time.sleep(0.2)
    else:
        pytest.fail("the overview did not show the new event within 15 s")
    assert browser.execute_script("return window.notReloaded === true;")  # swapped in place, not reloaded
    assert browser.find_element("id", "main").get_attribute("data-refreshed-at")


def test_an_action_performed_by_clicking_is_recorded(browser: Any, acting: tuple[str, str, str]) -> None:
    url, producer, consumer = acting
    browser.get(url + "effects/" + scene.DEAD.replace(":", "%3A"))
    browser.find_element("link text", "retry").click()
    assert browser.title == "Retry an effect - reliable_flow console"
    assert browser.find_element("name", "key").get_attribute("value") == scene.DEAD
    browser.find_element("name", "actor").send_keys("bob")
    browser.find_element("name", "reason").send_keys("INC-9: the carrier is back")
    browser.find_element("css selector", "form.act button[type=submit]").click()
    # the click may return before the POST's answer is loaded (chromedriver does not always wait for it)
    deadline = time.monotonic() + 15
    while browser.title == "Retry an effect - reliable_flow console" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert browser.title == "Operator actions - reliable_flow console"  # redirected after the POST
    text = _text(browser)
    assert f"effect '{scene.DEAD}' is pending again, due now" in text  # the flash sentence
    assert "INC-9: the carrier is back" in text and "bob" in text
    browser.refresh()  # a GET: nothing is sent again, the sentence is gone
    assert "is pending again" not in _text(browser)
    shown = subprocess.run([sys.executable, "-m", "reliable_flow", "inspect", producer, consumer, "--effect",
                            scene.DEAD], capture_output=True, text=True, env=child_env(), timeout=60,
                           check=False)
    assert "bob" in shown.stdout and "INC-9: the carrier is back" in shown.stdout, shown
    with Consumer(consumer, RESERVATION) as opened:
        assert [(a.action, a.actor) for a in opened.admin.effect_actions(scene.DEAD)] == [
            ("retry", scene.ACTOR), ("retry", "bob")]
