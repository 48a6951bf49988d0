"""The chat page in a real browser: headless Chromium (Debian's package, driven by Selenium and the system
chromedriver) against the live test daemon. Loads the page, sends a prompt, sees the answer stream in, stops a
generation, and saves screenshots (in $BARREL_TEST_ARTIFACTS, else the test's tmp dir)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import MODEL, wait_for

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the test extra (pip install -e .[test])")


def _find(*names: str) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium_paths() -> tuple[str, str]:
    """Chromium and chromedriver from the system; installed from Debian's packages when missing and possible."""
    browser, driver = _find("chromium", "chromium-browser"), _find("chromedriver")
    if browser and driver:
        return browser, driver
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium", "chromium-driver"]):
            if subprocess.run(cmd, env=env, capture_output=True, timeout=900).returncode != 0:
                break
        browser, driver = _find("chromium", "chromium-browser"), _find("chromedriver")
        if browser and driver:
            return browser, driver
    pytest.skip("no Chromium here and it could not be installed: run `apt-get install -y chromium chromium-driver` (Debian) as root")


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    binary, driver = chromium_paths()
    options = Options()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,800", "--disable-gpu"):
        options.add_argument(arg)
    b = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    b.set_page_load_timeout(30)
    yield b
    b.quit()


@pytest.fixture
def artifacts(tmp_path) -> Path:
    out = Path(os.environ.get("BARREL_TEST_ARTIFACTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def text_of(b, css: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [e.text for e in b.find_elements(By.CSS_SELECTOR, css)]


def test_chat_page_streams_and_stops(daemon, browser, artifacts):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait

    b = browser
    wait = WebDriverWait(b, 15, poll_frequency=0.05)
    b.get(daemon.url + "/")
    assert b.title == "barrel-inference"
    wait.until(lambda _: MODEL in [o.text for o in Select(b.find_element(By.ID, "model")).options])

    # a prompt streams in; the fake worker sends one word per tick, then STALL holds the stream open
    prompt = b.find_element(By.ID, "prompt")
    prompt.send_keys("streaming words arrive one by one STALL")
    prompt.send_keys(Keys.ENTER)
    wait.until(lambda _: any("one by one" in t for t in text_of(b, ".msg.assistant .body")))
    assert b.find_element(By.ID, "stop").is_enabled() and not b.find_element(By.ID, "send").is_enabled()
    b.save_screenshot(str(artifacts / "chat-streaming.png"))
    rid = next(iter(daemon.worker._running))
    b.find_element(By.ID, "stop").click()
    wait.until(lambda _: "stopped" in text_of(b, ".msg.assistant .stats")[-1])
    assert wait_for(lambda: rid in daemon.worker.aborts), "the stop button did not end the generation in the daemon"
    assert text_of(b, ".msg.assistant .body")[-1] == "streaming words arrive one by one"
    assert b.find_element(By.ID, "send").is_enabled()

    # a full answer: TTFT, tokens/s and cached tokens from the answer's usage
    prompt.send_keys("a complete answer this time")
    b.find_element(By.ID, "send").click()
    wait.until(lambda _: len(text_of(b, ".msg.assistant")) == 2 and "tokens/s" in text_of(b, ".msg.assistant .stats")[-1])
    stats = text_of(b, ".msg.assistant .stats")[-1]
    assert "TTFT" in stats and "5 tokens" in stats and "2 cached" in stats and "stopped" not in stats
    assert text_of(b, ".msg.assistant .body")[-1] == "a complete answer this time"
    sub = daemon.worker.submits[-1]
    assert [m.content for m in sub.messages] == ["a complete answer this time"]  # the stopped turn was not kept

    # the side panel: running models from /api/ps and the queue from /api/stats
    wait.until(lambda _: MODEL in b.find_element(By.ID, "running").text and MODEL in b.find_element(By.ID, "queue").text)
    b.save_screenshot(str(artifacts / "chat-answered.png"))
    assert (artifacts / "chat-answered.png").stat().st_size > 10_000
    logs = [e for e in b.get_log("browser") if e.get("level") == "SEVERE"]
    assert logs == [], logs


def test_docs_page_renders_the_openapi_document(daemon, browser, artifacts):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    b = browser
    b.get(daemon.url + "/docs")
    WebDriverWait(b, 15).until(lambda _: len(b.find_elements(By.CSS_SELECTOR, "details")) > 20)
    paths = text_of(b, "summary .path")
    assert "/v1/chat/completions" in paths and "/api/pull" in paths and "ChatCompletionRequest" in paths
    b.find_element(By.XPATH, "//summary[span[text()='/v1/chat/completions']]").click()
    b.save_screenshot(str(artifacts / "docs.png"))
    assert "messages" in b.find_element(By.XPATH, "//details[summary[span[text()='/v1/chat/completions']]]").text
