"""The dashboard's server side over real HTTP (an in-process daemon, no engine needed): the page and its
assets, their security headers, what needs the API key, the same-origin rule, and the JSON routes."""

from __future__ import annotations

import gzip
import json
import posixpath
import re
import sys
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

from modelrunner.server.dashboard.router import load_assets
from tests.conformance.dmr_daemons import FakeDaemons
from tests.daemon import error_message
from tests.inprocess import InProcessDaemon
from tests.models import write_tiny_gguf
from tests.users import as_other_user

Start = Callable[..., InProcessDaemon]


@pytest.fixture
def start(fake_daemons: FakeDaemons) -> Start:
    """A daemon without engines or models (the environment as the test set it)."""
    return lambda: fake_daemons.start(engines={}, models=())


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[dict[str, str | None]] = []
        self.urls: list[str] = []
        self.inline: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "script":
            self.scripts.append(found)
        if tag == "style":
            self.inline.append("<style>")
        for name, value in attrs:
            if name == "style" or name.startswith("on"):
                self.inline.append(f"{tag} {name}")
            if name in ("src", "href") and value and value.startswith("/"):
                self.urls.append(value)


def test_page_and_assets_are_served_with_a_strict_policy(start: Start) -> None:
    daemon = start()
    page = daemon.http("GET", "/dashboard")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "script-src 'self'" in policy and "style-src 'self'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert "frame-ancestors 'none'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    assert daemon.http("GET", "/dashboard/").text == page.text
    assert daemon.http("GET", "/").text == "Docker Model Runner is running"  # DMR's answer stays

    markup = _Markup()
    markup.feed(page.text)
    assert markup.inline == []  # nothing that would need 'unsafe-inline'
    assert markup.scripts and all(s.get("src") and s.get("type") == "module" for s in markup.scripts)
    for url in markup.urls:
        asset = daemon.http("GET", url)
        assert asset.status_code == 200, url
        assert asset.headers["content-security-policy"] == policy


def test_every_asset_is_local_and_builds_the_page_without_markup_from_strings() -> None:
    assets = load_assets()
    scripts = {name: a.body.decode() for name, a in assets.items() if name.endswith(".js")}
    assert "js/main.js" in scripts and "app.css" in assets
    for name, text in scripts.items():
        for imported in re.findall(r"""from\s+"(\.[^"]+)";""", text):
            target = posixpath.normpath(posixpath.join(posixpath.dirname(name), imported))
            assert target in assets, f"{name} imports {imported}, which is not in the package"
        for forbidden in (
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "Function(",
        ):
            assert forbidden not in text, f"{name} uses {forbidden}"
    for name, asset in assets.items():
        text = asset.body.decode()
        # the SVG namespace is a name, not a fetch; nothing else may point off the daemon
        urls = set(re.findall(r"https?://[^\s\"')]+", text)) - {"http://www.w3.org/2000/svg"}
        assert not urls, f"{name} refers to {urls}"
    assert sum(len(a.gzipped) for a in assets.values()) < 300_000


def test_gzip_and_etag(start: Start) -> None:
    daemon = start()
    plain = daemon.http("GET", "/dashboard/assets/js/main.js", headers={"accept-encoding": "identity"})
    assert plain.status_code == 200 and "content-encoding" not in plain.headers
    assert plain.headers["content-type"] == "text/javascript; charset=utf-8"
    packed = httpx.get(
        daemon.url + "/dashboard/assets/js/main.js", headers={"accept-encoding": "gzip"}, timeout=10
    )
    assert packed.headers["content-encoding"] == "gzip" and packed.content == plain.content
    assert int(packed.headers["content-length"]) == len(gzip.compress(plain.content, 9, mtime=0))
    again = daemon.http(
        "GET", "/dashboard/assets/js/main.js", headers={"if-none-match": plain.headers["etag"]}
    )
    assert again.status_code == 304 and again.content == b""


def test_unknown_assets_are_404_and_paths_cannot_leave_the_assets(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODEL_RUNNER_API_KEY", "s3cret")
    daemon = start()
    for path in (
        "/dashboard/assets/nope.js",
        "/dashboard/assets/index.html",
        "/dashboard/assets/%2e%2e/api/overview",
        "/dashboard/assets/..%2fapi/overview",
        "/dashboard/assets/%2e%2e/%2e%2e/version",
    ):
        response = httpx.get(daemon.url + path, timeout=10)
        assert response.status_code == 404, path
        assert "memory_budget" not in response.text


def test_the_page_needs_no_key_but_its_data_does(start: Start, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_RUNNER_API_KEY", "s3cret")
    daemon = start()
    assert daemon.http("GET", "/dashboard").status_code == 200
    assert daemon.http("GET", "/dashboard/assets/js/api.js").status_code == 200
    refused = daemon.http("GET", "/dashboard/api/overview")
    assert refused.status_code == 401 and error_message(refused) == "missing or wrong API key"
    assert (
        daemon.http("GET", "/dashboard/api/overview", headers={"authorization": "Bearer nope"}).status_code
        == 401
    )
    assert daemon.http("GET", "/dashboard/nothing-here").status_code == 401
    answer = daemon.http("GET", "/dashboard/api/overview", headers={"authorization": "Bearer s3cret"})
    assert answer.status_code == 200


def test_same_origin_calls_pass_and_other_origins_are_refused(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODEL_RUNNER_ALLOWED_HOSTS", "dash.example")
    daemon = start()
    host = f"dash.example:{daemon.port}"

    def unload(origin: str, host: str = host) -> httpx.Response:
        headers = {"host": host, "origin": origin}
        return daemon.http("POST", "/engines/unload", json={"all": True}, headers=headers)

    # a page served from http://dash.example:<port>/dashboard posting back to its own daemon
    assert unload(f"http://{host}").json() == {"unloaded_runners": 0}
    assert unload(f"http://{host}/").status_code == 200  # trailing slash, as some clients send it
    for origin in (
        "http://evil.example",
        f"http://evil.example:{daemon.port}",
        "http://dash.example",  # another port
        f"http://dash.example:{daemon.port + 1}",
        f"https://{host}",  # another scheme
        "null",
    ):
        refused = unload(origin)
        assert refused.status_code == 403, origin
        assert "origin is not allowed" in error_message(refused)
    # a Host the host check refuses is refused whatever the Origin says (DNS rebinding)
    assert unload(f"http://evil.example:{daemon.port}", host=f"evil.example:{daemon.port}").status_code == 403


def test_overview_and_model_files(start: Start, tmp_path: Path) -> None:
    daemon = start()
    overview = daemon.http("GET", "/dashboard/api/overview").json()
    assert overview["memory_budget"] > 0 and overview["memory_in_use"] == 0
    assert overview["loaded_runners"] == 0 and overview["queue_depth"] == 0
    assert overview["max_runners"] >= 1 and isinstance(overview["now"], float)

    licence = tmp_path / "LICENSE"
    licence.write_text("Tiny licence\n<script>alert(1)</script>\n")
    body = {
        "target": "tiny",
        "gguf": str(write_tiny_gguf(tmp_path / "tiny.gguf")),
        "licenses": [str(licence)],
    }
    assert daemon.http("POST", "/models/package", json=body).status_code == 201
    files = daemon.http("GET", "/dashboard/api/models/tiny/files").json()
    kinds = [layer["media_type"] for layer in files["layers"]]
    assert kinds == ["application/vnd.docker.ai.gguf.v3", "application/vnd.docker.ai.license"]
    assert files["layers"][0]["size"] == (tmp_path / "tiny.gguf").stat().st_size
    [text] = files["licenses"]
    assert text["text"] == licence.read_text() and text["truncated"] is False
    missing = daemon.http("GET", "/dashboard/api/models/absent/files")
    assert missing.status_code == 404 and "absent" in error_message(missing)


def test_the_package_form_asks_whether_the_daemon_reads_files_for_its_browser(start: Start) -> None:
    """Only for the daemon's own user (server/localuser.py), known by the owner of the connection: a key
    is not enough (`MODEL_RUNNER_API_KEY` is given to every client of the API)."""
    daemon = start()
    assert daemon.http("GET", "/dashboard/api/caller").json() == {"reads_files": True}
    code = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())"
    other = as_other_user(sys.executable, "-c", code, daemon.url + "/dashboard/api/caller")
    assert other.returncode == 0, other.stderr
    answer = json.loads(other.stdout)
    assert answer["reads_files"] is False and "only for the user it runs as" in answer["reason"]
