"""The dashboard driven in a real browser: Debian's chromium through Playwright, against a `model serve`
process with the built llama-server, the tiny GGUF, the diffusers environment and a real registry.

Screenshots of every page at 1280x800 and at 390x844 (a phone) are saved under the test's temporary folder
(`dashboard-screens*`; the path is printed). The first load's transfer size and time are written there as
first-load.json (recorded in bench/RESULTS.md; no test asserts a timing).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from playwright.sync_api import (
    Browser,
    ConsoleMessage,
    Page,
    Playwright,
    Route,
    ViewportSize,
    expect,
    sync_playwright,
)

from modelrunner.display import display_name
from tests.daemon import Daemon, free_port
from tests.models import write_tiny_gguf
from tests.registry import Registry, RegistryProxy
from tests.waiting import wait_until

CHROMIUM = Path("/usr/bin/chromium")
# Without the networking flags Chromium's own background connections are refused by a closed network.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DESKTOP: ViewportSize = {"width": 1280, "height": 800}
PHONE: ViewportSize = {"width": 390, "height": 844}
PAGES = ["models", "chat", "images", "engines", "requests", "logs", "metrics"]
OTHER_UID = 65534  # nobody: a browser run by another user than the daemon's


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    if not CHROMIUM.exists():
        raise RuntimeError(
            "the dashboard tests need Debian's chromium: apt-get install chromium (scripts/test does)"
        )
    with sync_playwright() as started:
        yield started


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
    yield launched
    launched.close()


@pytest.fixture(scope="module")
def screens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("dashboard-screens")
    print(f"dashboard screenshots: {folder}")
    return folder


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, llama_server: Path, tiny_sd_dduf: Path
) -> Iterator[Daemon]:
    folder = tmp_path_factory.mktemp("dashboard")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LLAMA_SERVER_PATH", str(llama_server))
        env.setenv("DOCKER_CONFIG", str(folder / "docker-empty"))  # never the machine's own credentials
        for name in ("INSECURE_REGISTRY", "MODEL_RUNNER_REGISTRY_MIRRORS", "DEFAULT_REGISTRY", "HF_TOKEN"):
            env.delenv(name, raising=False)
        env.delenv("MODEL_RUNNER_API_KEY", raising=False)
        running = Daemon(folder / "home", free_port()).start()
        running.cli("package", "--gguf", str(write_tiny_gguf(folder / "tiny.gguf")), "tiny")
        running.cli("package", "--gguf", str(write_tiny_gguf(folder / "other.gguf", seed=3)), "tiny-b")
        # answers of up to 32k tokens: llama-server caps a slot's context at the model's trained one
        long = write_tiny_gguf(folder / "long.gguf", seed=4, context_length=32768)
        running.cli("package", "--gguf", str(long), "tiny-long")
        running.cli("install-runner", "--backend", "diffusers", "--gpu", "none")
        running.cli("package", "--dduf", str(tiny_sd_dduf), "tiny-sd")
        yield running
        running.stop()


class Problems:
    """JavaScript errors and Content-Security-Policy violations seen by a page."""

    def __init__(self, page: Page) -> None:
        self.errors: list[str] = []
        page.on("pageerror", lambda error: self.errors.append(f"page error: {error}"))
        page.on("console", self._console)

    def _console(self, message: ConsoleMessage) -> None:
        text = message.text
        if "Content Security Policy" in text or (message.type == "error" and "Failed to load" not in text):
            self.errors.append(f"console: {text}")


# each page's Problems, watched from open_page on (a Page takes no attributes of ours)
PROBLEMS: weakref.WeakKeyDictionary[Page, Problems] = weakref.WeakKeyDictionary()


def open_page(
    browser: Browser, daemon: Daemon, page: str = "models", viewport: ViewportSize = DESKTOP
) -> Page:
    tab = browser.new_context(viewport=viewport).new_page()
    PROBLEMS[tab] = Problems(tab)
    tab.goto(f"{daemon.url}/dashboard#/{page}")
    tab.wait_for_selector("body[data-ready=true]")
    return tab


def no_problems(page: Page) -> None:
    assert PROBLEMS[page].errors == []
    page.context.close()


def runners(daemon: Daemon, model: str) -> list[dict[str, Any]]:
    """The model's runners; `model_name` is the name it was asked for by (the page sends full tags)."""
    found = daemon.http("GET", "/engines/ps").json()
    return [r for r in found if display_name(r["model_name"]) == model]


def metric(daemon: Daemon, name: str, model: str) -> float:
    for line in daemon.http("GET", "/metrics").text.splitlines():
        labels = re.search(r'model="([^"]*)"', line)
        if line.startswith(name + "{") and labels and display_name(labels.group(1)) == model:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for {model}")


def start_locked(daemon: Daemon) -> Daemon:
    """Daemon.start waits for /version, which needs the key here: wait for / (open) instead."""
    daemon.home.mkdir(parents=True, exist_ok=True)
    with open(daemon.log, "ab") as log:
        command = [sys.executable, "-m", "modelrunner", "serve"]
        daemon.process = subprocess.Popen(command, env=daemon.env, stdout=log, stderr=subprocess.STDOUT)

    def answers() -> bool:
        try:
            return httpx.get(daemon.url + "/", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(answers, "the daemon to start")
    return daemon


# -- the tests ----------------------------------------------------------------------------------------


def test_first_load_is_small_and_the_table_lists_what_model_ls_lists(
    browser: Browser, daemon: Daemon, screens: Path
) -> None:
    page = open_page(browser, daemon)  # a fresh context: nothing cached
    page.wait_for_selector("#models-table tbody tr")
    shown_at = page.evaluate("performance.now()")
    timing = page.evaluate(
        """() => {
        const nav = performance.getEntriesByType("navigation")[0];
        const resources = performance.getEntriesByType("resource");
        const mark = performance.getEntriesByName("dashboard-interactive")[0];
        return {
          transfer_bytes: nav.transferSize + resources.reduce((s, r) => s + r.transferSize, 0),
          decoded_bytes: nav.decodedBodySize + resources.reduce((s, r) => s + r.decodedBodySize, 0),
          requests: 1 + resources.length,
          dom_content_loaded_ms: nav.domContentLoadedEventEnd,
          interactive_ms: mark ? mark.startTime : null,
        };
      }"""
    )
    timing["models_listed_ms"] = shown_at
    (screens / "first-load.json").write_text(json.dumps(timing, indent=2))
    print("first load:", timing)
    assert timing["transfer_bytes"] < 300_000

    names = [cell.inner_text() for cell in page.query_selector_all("#models-table td.name")]
    ids = [cell.inner_text() for cell in page.query_selector_all("#models-table td.mono")]
    listed = daemon.cli("ls").stdout.splitlines()[1:]
    assert (
        sorted(names)
        == sorted(line.split()[0] for line in listed)
        == ["tiny", "tiny-b", "tiny-long", "tiny-sd"]
    )
    assert sorted(ids) == sorted(daemon.cli("ls", "--quiet").stdout.split())

    page.fill("input[type=search]", "sd")
    assert [c.inner_text() for c in page.query_selector_all("#models-table td.name")] == ["tiny-sd"]
    page.fill("input[type=search]", "")
    page.click("#models-table tr[data-id] >> text=tiny-b")
    dialog = page.wait_for_selector("dialog[open]")
    assert dialog is not None
    page.wait_for_selector("dialog[open] .table.compact td.mono")
    assert "llama.context_length" in (dialog.text_content() or "")  # GGUF metadata, folded
    assert "application/vnd.docker.ai.gguf.v3" in dialog.inner_text()  # layers
    page.fill("dialog[open] input[aria-label='New tag']", "team/renamed:v2")
    page.click("dialog[open] button:text('Tag')")
    wait_until(lambda: "team/renamed:v2" in daemon.cli("ls").stdout, "the new tag")
    page.wait_for_selector("#models-table .chip:text('team/renamed:v2')")
    page.click("#models-table .chip:text('team/renamed:v2')")
    page.once("dialog", lambda confirm: confirm.accept())
    page.click("dialog[open] [data-tag$='team/renamed:v2'] button")
    wait_until(lambda: "team/renamed:v2" not in daemon.cli("ls").stdout, "the tag removed")
    no_problems(page)


def test_a_pull_shows_progress_per_layer_is_resumed_and_ends_in_the_table(
    browser: Browser, daemon: Daemon, tmp_path: Path, screens: Path
) -> None:
    registry = Registry(tmp_path / "registry").start()
    proxy = RegistryProxy(registry.host).start()
    try:
        ref = f"{proxy.host}/team/pulled:v1"
        gguf = write_tiny_gguf(tmp_path / "pulled.gguf", seed=5)
        daemon.cli("package", "--gguf", str(gguf), ref)
        daemon.cli("push", ref)
        daemon.cli("rm", ref)
        partial = (
            daemon.store_root
            / "blobs/sha256"
            / (hashlib.sha256(gguf.read_bytes()).hexdigest() + ".incomplete")
        )
        proxy.controls.hold_after = 200_000  # each blob answer stops there until released

        page = open_page(browser, daemon)
        page.fill("#pull-form input", ref)
        page.click("#pull-form button")
        page.wait_for_selector(".pull[data-status=running] .layer:has-text('461 kB')")
        wait_until(lambda: partial.exists() and partial.stat().st_size == 200_000, "the held download")
        page.click(".pull button:text('Cancel')")  # a cut: the daemon keeps what it has for a resume
        page.wait_for_selector(".pull[data-status=cancelled]")
        proxy.controls.release.set()  # ends the held answer
        time.sleep(0.5)
        proxy.controls.release.clear()  # and holds the next one again, 200 kB further
        proxy.reset_counts()

        page.click(".pull button:text('Resume')")
        page.wait_for_function(  # the layer's bar, partly filled, while the registry holds the rest
            "() => [...document.querySelectorAll('.pull[data-status=running] .layer .bar-fill')]"
            ".some((f) => parseFloat(f.style.width) > 40 && parseFloat(f.style.width) < 100)"
        )
        layer = page.inner_text(".pull .layer:has-text('/ 461 kB')")
        # from the 200 kB kept to the 400 kB where the proxy holds (it may show exactly that: the last
        # progress line before the hold is not throttled away)
        done = re.search(r"\b(\d+(?:\.\d+)?) kB / 461 kB", layer)
        assert done and 200 <= float(done.group(1)) <= 400, layer
        page.screenshot(path=screens / "models-pull-1280.png")
        assert proxy.ranges == ["bytes=200000-"]

        proxy.controls.hold_after = None
        proxy.controls.release.set()
        page.wait_for_selector(".pull[data-status=done], .pull[data-status=failed]", timeout=60_000)
        if page.query_selector(".pull[data-status=failed]"):  # the held answer was cut: resume once more
            page.click(".pull button:text('Resume')")
            page.wait_for_selector(".pull[data-status=done]", timeout=60_000)
        page.locator("#models-table td.name", has_text=ref).wait_for()
        assert proxy.blob_bytes <= gguf.stat().st_size - 200_000  # the kept part was not fetched again
        assert ref in daemon.cli("ls").stdout
        no_problems(page)
    finally:
        proxy.stop()
        registry.stop()
    daemon.cli("rm", ref)


def test_a_refused_pull_offers_no_resume_and_an_engine_not_installable_here_no_install(
    browser: Browser, daemon: Daemon, tmp_path: Path
) -> None:
    """Issue 37: a pull the registry refused (not found) has nothing to resume, so Dismiss alone; an engine
    that runs on this platform but that an install cannot make usable here (sglang) says so, where its
    Install button only failed."""
    registry = Registry(tmp_path / "registry").start()
    try:
        page = open_page(browser, daemon)
        page.fill("#pull-form input", f"{registry.host}/team/absent:v1")
        page.click("#pull-form button")
        failed = page.wait_for_selector(".pull[data-status=failed]")
        assert failed is not None and "not found" in failed.inner_text()
        assert [b.inner_text() for b in failed.query_selector_all("button")] == ["Dismiss"]
    finally:
        registry.stop()
    page.goto(f"{daemon.url}/dashboard#/engines")
    row = page.wait_for_selector("#engines-table tr[data-engine=sglang]")
    assert row is not None and "cannot be installed here" in row.inner_text()
    assert row.query_selector("button") is None
    assert page.query_selector("#engines-table tr[data-engine='llama.cpp'] button") is not None
    no_problems(page)


def test_markdown_from_a_model_is_never_markup(browser: Browser, daemon: Daemon) -> None:
    page = open_page(browser, daemon, "chat")
    html = page.evaluate(
        """async () => {
        const { renderMarkdown } = await import("/dashboard/assets/js/markdown.js");
        const box = document.createElement("div");
        box.append(renderMarkdown('<img src=x onerror="window.hit=1"> **bold** `a<b>`'
          + ' [x](javascript:alert(1)) [ok](https://example.org/)\\n\\n'
          + '```html\\n<script>window.hit=2</script>\\n```\\n- one\\n- two'));
        document.body.append(box);
        return { text: box.textContent, tags: [...box.querySelectorAll("*")].map((e) => e.tagName),
                 links: [...box.querySelectorAll("a")].map((a) => a.href), hit: window.hit || 0 };
      }"""
    )
    assert html["hit"] == 0
    assert "IMG" not in html["tags"] and "SCRIPT" not in html["tags"]
    assert {"STRONG", "CODE", "PRE", "UL", "LI"} <= set(html["tags"])
    assert html["links"] == ["https://example.org/"]  # javascript: stays text
    assert (
        '<img src=x onerror="window.hit=1">' in html["text"]
        and "<script>window.hit=2</script>" in html["text"]
    )
    no_problems(page)


def test_chat_streams_and_the_stop_button_ends_the_engines_generation(
    browser: Browser, daemon: Daemon
) -> None:
    page = open_page(browser, daemon, "chat")
    page.wait_for_selector(".pane select option[value*='tiny']", state="attached")
    page.select_option(".pane select", label="tiny-long")
    # a long generation: a context the answer cannot fill soon, no stop at end-of-text
    page.fill("input[name=context]", "32768")
    page.fill("input[name=max_tokens]", "30000")
    page.click("summary:text('More request fields')")
    page.fill("textarea[name=extra]", '{"ignore_eos": true}')
    page.fill("#prompt", "Tell me a long story")
    page.press("#prompt", "Enter")
    answer = page.wait_for_selector(".msg.assistant[data-state=streaming]")
    page.wait_for_function(
        "() => { const m = document.querySelector('.msg.assistant'); return m.textContent.length > 50; }"
    )
    assert "first token" in answer.query_selector(".msg-stats").inner_text()  # type: ignore[union-attr]
    [runner] = runners(daemon, "tiny-long")
    assert "--ctx-size\x0032768" in Path(f"/proc/{runner['pid']}/cmdline").read_text()  # the context field
    assert runner["in_use"] is True
    assert metric(daemon, "llamacpp:requests_processing", "tiny-long") == 1  # the engine is generating

    page.click("#stop")
    page.wait_for_selector(".msg.assistant[data-state=stopped]")
    wait_until(lambda: not runners(daemon, "tiny-long")[0]["in_use"], "the runner's release")
    wait_until(lambda: metric(daemon, "llamacpp:requests_processing", "tiny-long") == 0, "the engine to stop")
    predicted = metric(daemon, "llamacpp:tokens_predicted_total", "tiny-long")
    time.sleep(1.0)  # had it gone on, hundreds of tokens would be generated in this second
    assert metric(daemon, "llamacpp:tokens_predicted_total", "tiny-long") == predicted < 30_000
    assert metric(daemon, "llamacpp:requests_processing", "tiny-long") == 0
    stats = answer.query_selector(".msg-stats").inner_text()  # type: ignore[union-attr]
    assert "tokens/s" in stats and "stopped" in stats, stats

    # the same prompt to two models side by side; the conversation stays in the browser, and so does the
    # extra field's ignore_eos, which keeps either random-weight answer from ending before its first token
    page.fill("input[name=max_tokens]", "8")
    page.fill("input[name=context]", "")
    page.click("button:text('Compare with another model')")
    page.select_option(".pane[data-pane='1'] select", label="tiny-b")
    page.fill("#prompt", "hi")
    page.click("#send")
    page.wait_for_function("() => document.querySelectorAll('.msg.assistant[data-state=done]').length === 2")
    for pane in ("0", "1"):
        stats = page.inner_text(f".pane[data-pane='{pane}'] .msg.assistant[data-state=done] .msg-stats")
        # at most max_tokens: the random-weight model's answer may end before it (CI saw 5 of 8 once)
        assert "first token" in stats and "tokens/s" in stats and re.search(r"\b[1-8] tokens\b", stats), stats
        # ignore_eos: only max_tokens ends it (finish_reason "length"), which the page says (issue 37 item 6)
        assert "cut short: it reached the token limit" in stats, stats
    page.reload()
    page.wait_for_selector(".pane[data-pane='1'] .msg.assistant[data-state=done]")
    assert len(page.query_selector_all(".msg.user")) == 3
    no_problems(page)


def test_an_image_model_shows_a_png_that_can_be_downloaded(
    browser: Browser, daemon: Daemon, tmp_path: Path
) -> None:
    page = open_page(browser, daemon, "images")
    page.wait_for_selector("#image-form select option[value*='tiny-sd']", state="attached")
    page.fill("textarea[name=prompt]", "a nice cat")
    for name, value in (("width", "64"), ("height", "96"), ("steps", "2"), ("seed", "7")):
        page.fill(f"input[name={name}]", value)
    page.click("#image-form button[type=submit]")
    image = page.wait_for_selector("#gallery img", timeout=120_000)
    assert image is not None
    page.wait_for_function("() => document.querySelector('#gallery img').naturalWidth > 0")
    assert image.evaluate("(img) => [img.naturalWidth, img.naturalHeight]") == [64, 96]
    with page.expect_download() as download:
        page.click("#gallery a:text('Download PNG')")
    saved = tmp_path / download.value.suggested_filename
    download.value.save_as(saved)
    assert saved.name.endswith("-7.png") and saved.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    no_problems(page)


def test_unload_frees_the_runner(browser: Browser, daemon: Daemon) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert daemon.http("POST", "/engines/v1/chat/completions", json=body).status_code == 200
    [pid] = [r["pid"] for r in runners(daemon, "tiny")]
    page = open_page(browser, daemon, "engines")
    # locators, not element handles: the table is redrawn on every refresh, and a handle then points at a
    # row that is no longer in the page
    row = page.locator("#runners-table tr[data-model='tiny']")
    assert re.search(r"\d+m \d+s|\d+ s", row.locator("td.keep").inner_text())
    assert "budget" in page.inner_text("#budget")
    row.locator("button:text('Unload')").click()
    page.wait_for_selector("#runners-table tr[data-model='tiny']", state="detached")
    assert runners(daemon, "tiny") == []
    wait_until(lambda: not Path(f"/proc/{pid}").exists(), "the engine process to exit")
    # the unload saved the prompt cache: the next load restores it, and the table says so
    assert daemon.http("POST", "/engines/v1/chat/completions", json=body).status_code == 200
    warm = page.locator("#runners-table tr[data-model='tiny'] .badge.warm")
    warm.wait_for()
    assert re.fullmatch(r"warm · \d+ tokens", warm.inner_text())
    no_problems(page)


def test_configure_shows_the_apis_validation(browser: Browser, daemon: Daemon) -> None:
    page = open_page(browser, daemon, "engines?configure=tiny-b")
    page.wait_for_selector("#configure-form select[name=model] option[value*='tiny-b']", state="attached")
    page.fill("#configure-form input[name=keep_alive]", "soon")
    page.click("#configure-form button[type=submit]")
    error = page.wait_for_selector("#configure .notice.error")
    assert error is not None
    assert "keep" in error.inner_text().lower()
    assert daemon.http("GET", "/engines/_configure", params={"model": "tiny-b"}).json() == []
    page.fill("#configure-form input[name=keep_alive]", "10m")
    page.fill("#configure-form input[name=context-size]", "256")
    page.click("#configure-form button[type=submit]")
    page.wait_for_selector("#configure .notice.ok")
    [saved] = daemon.http("GET", "/engines/_configure", params={"model": "tiny-b"}).json()
    assert saved["Config"].get("context-size", saved["Config"].get("context_size")) == 256
    page.wait_for_selector("#configs td:text('tiny-b')")
    no_problems(page)


def test_a_drafting_runner_shows_its_share_of_drafts_accepted(browser: Browser, daemon: Daemon) -> None:
    """engines/llamacpp_drafting.py: the runner's badge says what `/engines/ps` says, the share accepted
    once the engine drafted (a random model's greedy loop repeats itself: n-grams to draft from)."""
    daemon.cli("configure", "--draft-from-context", "ngram-simple", "tiny-b")
    body = {"model": "tiny-b", "prompt": "one two three " * 20, "max_tokens": 200, "temperature": 0}
    assert daemon.http("POST", "/engines/v1/completions", json=body).status_code == 200
    [drafting] = [r["drafting"] for r in runners(daemon, "tiny-b")]
    page = open_page(browser, daemon, "engines")
    badge = page.locator("#runners-table tr[data-model='tiny-b'] .badge.drafting")
    badge.wait_for()
    if drafting.get("drafted_tokens"):
        share = math.floor(100 * drafting["acceptance_rate"] + 0.5)  # as JavaScript's Math.round
        assert badge.inner_text() == f"drafts · {share}% accepted"
    else:
        assert badge.inner_text() == "drafts · ngram-simple"
    assert "ngram-simple" in (badge.get_attribute("title") or "")
    # back to its defaults; it runs after test_configure_shows_the_apis_validation, which wants no entry
    daemon.cli("configure", "tiny-b")
    no_problems(page)


def test_a_wrong_key_gets_a_clear_message(
    browser: Browser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODEL_RUNNER_API_KEY", "the-right-key")
    locked = start_locked(Daemon(tmp_path / "home", free_port()))
    try:
        page = open_page(browser, locked)
        banner = page.wait_for_selector("#auth:not([hidden])")
        assert banner is not None
        assert "needs an API key" in banner.inner_text() and "MODEL_RUNNER_API_KEY" in banner.inner_text()
        page.fill("#api-key", "a-wrong-key")
        page.click("#key-form button[type=submit]")
        page.wait_for_selector("#auth:text('The API key was refused')")
        assert "a-wrong-key" not in page.url
        page.fill("#api-key", "the-right-key")
        page.click("#key-form button[type=submit]")
        page.wait_for_selector("#auth", state="hidden")
        page.wait_for_selector("#models-table")
        assert page.evaluate("sessionStorage.getItem('modelrunner.apiKey')") == "the-right-key"
        assert page.evaluate("localStorage.length") == 0 or "the-right-key" not in page.evaluate(
            "JSON.stringify(localStorage)"
        )
        no_problems(page)
    finally:
        locked.stop()


def test_logs_follow_live(browser: Browser, daemon: Daemon) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert daemon.http("POST", "/engines/v1/chat/completions", json=body).status_code == 200  # an engine log
    page = open_page(browser, daemon, "logs")
    page.wait_for_selector("#log .line")
    before = page.evaluate("document.querySelectorAll('#log .line').length")
    assert daemon.http("POST", "/engines/v1/chat/completions", json=body).status_code == 200
    page.wait_for_function(f"() => document.querySelectorAll('#log .line').length > {before}")
    page.fill("input[name=filter]", "no line has this text")
    assert page.evaluate("[...document.querySelectorAll('#log .line')].every((l) => l.hidden)")
    no_problems(page)


def record_with(daemon: Daemon, text: str, finished: bool = True) -> dict[str, Any] | None:
    """The recorded request whose body holds `text` (GET /engines/requests), once it is finished (a record
    is listed from the runner's acquisition on, with status_code 0 until the recorder finishes it, after
    the answer's last byte): None until then. `finished=False`: as it is listed, finished or not."""
    for entry in daemon.http("GET", "/engines/requests").json():
        for record in entry["records"]:
            if text in record["request"] and (record["status_code"] or not finished):
                return record  # type: ignore[no-any-return]
    return None


def opened_record(page: Page, record: dict[str, Any], screenshot: Path | None = None) -> dict[str, Any]:
    """Click the record's row; what its dialog shows: the fields, and the request and response parsed."""
    page.click(f"#requests-table tr[data-id='{record['id']}']")
    dialog = page.wait_for_selector("dialog[open]")
    assert dialog is not None
    if screenshot is not None:
        page.screenshot(path=screenshot)
    shown = {
        "text": dialog.inner_text(),
        "request": json.loads(page.inner_text("dialog[open] pre.body >> nth=0")),
        "response": json.loads(page.inner_text("dialog[open] pre.body >> nth=1")),
    }
    page.click("dialog[open] button.close")
    page.wait_for_selector("dialog[open]", state="detached")
    return shown


def test_requests_from_the_chat_page_and_a_client_appear_live_with_their_bodies(
    browser: Browser, daemon: Daemon, screens: Path
) -> None:
    """The request recorder (DMR's shape: pkg/metrics/openai_recorder.go) followed by server-sent events:
    the page is open before the requests are made and is never reloaded."""
    page = open_page(browser, daemon, "requests")
    page.wait_for_selector("#requests-table")

    chat = page.context.new_page()  # the Chat page in another tab of the same browser
    PROBLEMS[chat] = Problems(chat)
    chat.goto(f"{daemon.url}/dashboard#/chat")
    chat.wait_for_selector(".pane select option[value*='tiny']", state="attached")
    chat.select_option(".pane select", label="tiny")
    chat.fill("input[name=max_tokens]", "6")
    chat.fill("#prompt", "asked on the chat page")
    chat.press("#prompt", "Enter")
    chat.wait_for_selector(".msg.assistant[data-state=done]")
    from_chat = wait_until(lambda: record_with(daemon, "asked on the chat page"), "the chat's record")
    assert from_chat is not None  # wait_until returns a true value
    row = page.wait_for_selector(f"#requests-table tr[data-id='{from_chat['id']}']")
    assert row is not None
    cells = row.inner_text()
    assert "tiny" in cells and "/engines/v1/chat/completions" in cells and "200" in cells
    assert f"→ {from_chat['completion_tokens']}" in cells and re.search(r"\d+ ms|\d\.\d s", cells), cells
    shown = opened_record(page, from_chat, screens / "requests-record-1280.png")
    assert shown["request"]["messages"][-1]["content"] == "asked on the chat page"
    assert shown["request"]["stream"] is True  # streamed, and shown whole
    assert shown["response"] == json.loads(from_chat["response"])
    assert shown["response"]["choices"][0]["message"]["role"] == "assistant"
    assert from_chat["request_id"] in shown["text"] and "Duration" in shown["text"]
    assert PROBLEMS[chat].errors == []
    chat.close()

    client = openai.OpenAI(base_url=daemon.url + "/engines/v1", api_key="unused", max_retries=0)
    answer = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "asked by the openai client"}], max_tokens=4
    )
    from_client = wait_until(lambda: record_with(daemon, "asked by the openai client"), "the client's record")
    assert from_client is not None
    page.wait_for_selector(f"#requests-table tr[data-id='{from_client['id']}']")
    shown = opened_record(page, from_client)
    assert shown["response"]["choices"][0]["message"]["content"] == answer.choices[0].message.content
    assert answer.usage is not None and from_client["completion_tokens"] == answer.usage.completion_tokens
    assert "OpenAI/Python" in shown["text"]  # the client, as its User-Agent says
    no_problems(page)


def test_requests_that_end_while_the_requests_page_loads_are_shown_finished(
    browser: Browser, daemon: Daemon
) -> None:
    """The page's list of the kept records and its follow of new ones leave no gap: a request running as
    the page lists the records and ending before the follow starts is shown finished, not running ("…"),
    and one that starts and ends in between is shown at all. The follow is held (a Playwright route) while
    both end; the page listed the records with a GET before it followed, and lost both."""
    configured = daemon.http(
        "POST", "/engines/_configure", json={"model": "tiny-long", "context-size": 32768}
    )
    assert configured.status_code < 300, configured.text
    long = {
        "model": "tiny-long",
        "messages": [{"role": "user", "content": "running as the page loads"}],
        "max_tokens": 30000,
        "ignore_eos": True,  # an answer of megabytes, never read: it runs until its client goes
        "stream": True,
    }
    held: list[Route] = []

    def hold_the_follow(route: Route) -> None:
        if route.request.headers.get("accept") == "text/event-stream" and not held:
            held.append(route)
        else:
            route.continue_()

    url = daemon.url + "/engines/v1/chat/completions"
    with httpx.stream("POST", url, json=long, timeout=60) as running:
        assert running.status_code == 200
        chunks = running.iter_raw()  # kept: an iterator let go of closes the connection
        next(chunks)  # answered: recorded and running
        page = open_page(browser, daemon)
        page.route(lambda address: "/engines/requests" in address, hold_the_follow)
        page.goto(f"{daemon.url}/dashboard#/requests")
        deadline = time.monotonic() + 30
        while not held:  # Playwright calls the route's handler while the page waits
            assert time.monotonic() < deadline, "the requests page never followed the records"
            page.wait_for_timeout(50)
        quick = {"model": "tiny", "messages": [{"role": "user", "content": "ended as the page loads"}]}
        answered = daemon.http("POST", "/engines/v1/chat/completions", json={**quick, "max_tokens": 2})
        assert answered.status_code == 200, answered.text
        unfinished = record_with(daemon, "running as the page loads", finished=False)
        assert unfinished is not None and unfinished["status_code"] == 0  # running until closed here
    ended = wait_until(lambda: record_with(daemon, "ended as the page loads"), "the quick request's record")
    cut = wait_until(lambda: record_with(daemon, "running as the page loads"), "the cut request's record")
    assert ended is not None and cut is not None
    held[0].continue_()
    for record in (ended, cut):
        badge = page.locator(f"#requests-table tr[data-id='{record['id']}'] .badge")
        expect(badge).to_have_text(str(record["status_code"]), timeout=15_000)
    no_problems(page)


def chart_peak(page: Page, chart: str) -> float:
    return float(page.get_attribute(f"[data-chart={chart}]", "data-peak") or 0)


def test_the_metrics_charts_show_data_after_a_few_chats(browser: Browser, daemon: Daemon) -> None:
    """tokens/s, time to first token, requests and memory from the daemon's own metrics (/metrics)."""
    page = open_page(browser, daemon, "metrics")
    page.wait_for_selector("[data-chart=tokens] svg")
    client = openai.OpenAI(base_url=daemon.url + "/engines/v1", api_key="unused", max_retries=0)
    for question in ("one", "two", "three"):
        stream = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": question}], max_tokens=16, stream=True
        )
        assert list(stream)
    page.wait_for_function("() => Number(document.querySelector('[data-chart=tokens]').dataset.peak) > 0")
    page.wait_for_function("() => Number(document.querySelector('[data-chart=ttft]').dataset.peak) > 0")
    assert chart_peak(page, "memory") > 0  # the loaded runner's estimate
    assert page.query_selector("[data-chart=ttft] .chart-note").inner_text() == ""  # type: ignore[union-attr]
    assert re.search(r"\d+ ms|\d\.\d s", page.inner_text("[data-chart=ttft] .legend"))
    assert len(page.query_selector_all("[data-chart=queue] path.line")) == 3
    assert "budget" in page.inner_text("[data-chart=memory] .legend")
    assert "modelrunner_generated_tokens_total" in (page.text_content("pre.raw-metrics") or "")
    no_problems(page)


@pytest.fixture(scope="module")
def other_users_browser(playwright: Playwright) -> Iterator[Browser]:
    """Debian's chromium run as another user (nobody) through setpriv: the profile Playwright makes is
    given to that user, and its home is a folder that user may write (pytest's own are root's)."""
    if os.geteuid() != 0:
        pytest.fail("this test runs chromium as another user with setpriv, which needs root", pytrace=False)
    folder = Path(tempfile.mkdtemp(prefix="modelrunner-other-browser-"))
    folder.chmod(0o755)
    home = folder / "home"
    home.mkdir()
    os.chown(home, OTHER_UID, OTHER_UID)
    wrapper = folder / "chromium-as-other-user"
    wrapper.write_text(
        "#!/bin/sh\n"
        'for arg in "$@"; do\n'
        '  case "$arg" in --user-data-dir=*)\n'
        f'    chown -R {OTHER_UID}:{OTHER_UID} "${{arg#--user-data-dir=}}" ;;\n'
        "  esac\n"
        "done\n"
        f"exec setpriv --reuid={OTHER_UID} --regid={OTHER_UID} --clear-groups "
        f'env HOME={home} {CHROMIUM} "$@"\n'
    )
    wrapper.chmod(0o755)
    try:
        launched = playwright.chromium.launch(executable_path=str(wrapper), args=CHROMIUM_FLAGS)
        yield launched
        launched.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_package_form_packages_for_the_daemons_own_user(
    browser: Browser, daemon: Daemon, tmp_path: Path
) -> None:
    gguf = write_tiny_gguf(tmp_path / "form.gguf", seed=6)
    page = open_page(browser, daemon)  # chromium runs as the daemon's user (root here)
    page.click("#package summary")
    page.fill("#package-form input[name=target]", "team/from-form:v1")
    page.fill("#package-form input[name=path]", str(gguf))
    page.click("#package-form button[type=submit]")
    page.wait_for_selector("#package .notice.ok")
    page.locator("#models-table td.name", has_text="team/from-form:v1").wait_for()
    assert "team/from-form:v1" in daemon.cli("ls").stdout
    assert page.query_selector("#package-access .notice") is None
    no_problems(page)
    daemon.cli("rm", "team/from-form:v1")


def test_the_package_form_tells_another_user_why_it_is_refused(
    other_users_browser: Browser, daemon: Daemon, screens: Path
) -> None:
    """The daemon reads files by path only for its own user (server/localuser.py): a browser run by
    another user is told so before it tries, and the daemon refuses it whatever the page does."""
    shared = Path(tempfile.mkdtemp(prefix="modelrunner-shared-"))
    try:
        shared.chmod(0o755)
        gguf = write_tiny_gguf(shared / "public.gguf", seed=7)
        gguf.chmod(0o644)
        before = daemon.cli("ls", "--quiet").stdout
        for viewport, label in ((DESKTOP, "1280"), (PHONE, "390")):
            page = open_page(other_users_browser, daemon, viewport=viewport)
            page.click("#package summary")
            note = page.wait_for_selector("#package-access .notice.warn")
            assert note is not None
            text = note.inner_text()
            assert "does not run as the model runner's user" in text and "model package" in text, text
            assert "only for the user it runs as" in (note.get_attribute("title") or "")  # the daemon's words
            assert page.is_disabled("#package-form button[type=submit]")
            assert page.is_disabled("#package-form input[name=path]")
            page.locator("#package").scroll_into_view_if_needed()
            page.screenshot(path=screens / f"models-package-refused-{label}.png")
            status = page.evaluate(
                """async (path) => (await fetch("/models/package", {method: "POST",
                    headers: {"Content-Type": "application/json"},
                    body: JSON.stringify({target: "stolen", gguf: path})})).status""",
                str(gguf),
            )
            assert status == 403
            no_problems(page)
        assert daemon.cli("ls", "--quiet").stdout == before
    finally:
        shutil.rmtree(shared)


def test_the_requests_and_logs_pages_tell_another_user_why_they_are_refused(
    other_users_browser: Browser, daemon: Daemon
) -> None:
    """Prompts, answers and logs are the daemon's user's (server/admin_api.py daemon_user_only): a browser
    run by another user shows the daemon's reason instead."""
    for name in ("requests", "logs"):
        page = open_page(other_users_browser, daemon, name)
        note = page.wait_for_selector(".messages .notice.error")
        assert note is not None
        text = note.inner_text()
        assert "only to the user the model runner runs as" in text and "MODEL_RUNNER_API_KEY" in text, text
        assert page.query_selector("#requests-table, #log .line") is None
        no_problems(page)


def test_every_page_reads_well_on_a_desktop_and_a_phone(
    browser: Browser, daemon: Daemon, screens: Path
) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert (
        daemon.http("POST", "/engines/v1/chat/completions", json=body).status_code == 200
    )  # a runner to show
    ready = {
        "models": "#models-table tbody tr",
        "chat": ".pane select option",
        "images": "#image-form select option",
        "engines": "#runners-table tbody tr",
        "requests": "#requests-table, .notice",
        "logs": "#log .line",
        "metrics": "#charts svg path.line",
    }
    for viewport, label in ((DESKTOP, "1280"), (PHONE, "390")):
        page = open_page(browser, daemon, viewport=viewport)
        for name in PAGES:
            page.goto(f"{daemon.url}/dashboard#/{name}")
            page.wait_for_selector(ready[name], timeout=30_000, state="attached")
            if name == "chat":  # an answer to show (each browser context has its own storage)
                page.fill("input[name=max_tokens]", "24")
                page.fill("#prompt", "Write a haiku about the sea")
                page.press("#prompt", "Enter")
                page.wait_for_selector(".msg.assistant[data-state=done]")
            if name == "images":  # an image to show (the gallery lives in the tab)
                page.fill("textarea[name=prompt]", "a lighthouse at dawn")
                for field, value in (("width", "64"), ("height", "64"), ("steps", "2"), ("seed", "1")):
                    page.fill(f"input[name={field}]", value)
                page.click("#image-form button[type=submit]")
                page.wait_for_selector("#gallery img", timeout=120_000)
            if name == "metrics":  # a few answers to chart
                for question in ("one", "two"):
                    streamed = {**body, "messages": [{"role": "user", "content": question}], "stream": True}
                    assert (
                        daemon.http("POST", "/engines/v1/chat/completions", json=streamed).status_code == 200
                    )
                page.wait_for_function(
                    "() => Number(document.querySelector('[data-chart=ttft]').dataset.peak) > 0"
                )
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"{name} is wider than a {label} px screen by {overflow} px"
            page.screenshot(path=screens / f"{name}-{label}.png")
        no_problems(page)
    assert {f"{n}-{s}.png" for n in PAGES for s in ("1280", "390")} <= set(os.listdir(screens))


def test_an_engine_is_uninstalled_and_installed_with_progress(browser: Browser, daemon: Daemon) -> None:
    # diffusers: installing it again copies the cached environment (engines/diffusers.py), in seconds
    page = open_page(browser, daemon, "engines")
    row = "#engines-table tr[data-engine=diffusers]"
    page.wait_for_selector(f"{row} .badge:text('Running')")
    page.once("dialog", lambda confirm: confirm.accept())
    page.click(f"{row} button:text('Uninstall')")
    page.wait_for_selector(f"{row} .badge:text('Not Installed')")
    assert daemon.http("GET", "/engines/status").json()["diffusers"].startswith("Not Installed")
    # the page's look at the engines as the install starts is answered last, after the install's own: an
    # older answer is not shown over a newer one (it was, and the engine stayed "Not Installed")
    before_install = daemon.http("GET", "/engines/info").text
    held: list[Route] = []
    page.route("**/engines/info", lambda route: route.continue_() if held else held.append(route))
    page.click(f"{row} button:text('Install')")
    page.wait_for_selector(".install-row pre.install-log")  # the progress lines, as they come
    page.wait_for_selector(f"{row} .badge:text('Running')", timeout=300_000)
    # the status may say Running before the install's last line (its success) is shown
    expect(page.locator(".install-row pre.install-log")).to_contain_text(
        "diffusers is installed", timeout=30_000
    )
    assert daemon.http("GET", "/engines/status").json()["diffusers"].startswith("Running")
    [late] = held
    # The page reads an answer with Response.json(); the stale one is marked (a header) and its read is
    # watched. Once that read has settled, the page's own continuation (getJSON, then refreshEngines and its
    # render, if it renders) runs in microtasks: a task queued after the settlement runs after all of them.
    page.evaluate(
        """() => {
        const json = Response.prototype.json;
        window.staleAnswerRead = new Promise((resolve) => {
          Response.prototype.json = function () {
            const read = json.call(this);
            if (this.headers.get("x-stale-answer")) read.then(resolve, resolve);
            return read;
          };
        });
      }"""
    )
    late.fulfill(
        status=200, headers={"content-type": "application/json", "x-stale-answer": "1"}, body=before_install
    )
    page.evaluate(
        """() => Promise.race([
          window.staleAnswerRead.then(() => new Promise((resolve) => setTimeout(() => resolve(true), 0))),
          new Promise((resolve) => setTimeout(() => resolve(false), 30000)),
        ]).then((read) => { if (!read) throw new Error("the page never read the stale answer"); })"""
    )
    assert page.inner_text(f"{row} td:nth-child(2) .badge") == "Running"
    no_problems(page)
