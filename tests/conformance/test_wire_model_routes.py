"""Model routes' details as DMR answers them: OpenAI ids, partial names, tag's message, unknown actions,
query flags, path cleaning, export's and CORS preflight's headers, `?remote`.

Follows: `pkg/inference/models/api.go`, `pkg/inference/models/http_handler.go`,
`pkg/inference/models/manager.go`, `pkg/inference/models/adapter.go`, `pkg/middleware/cors.go` and Go's
`net/http` ServeMux.
"""

from __future__ import annotations

import http.client
from pathlib import Path

from tests.conformance.dmr_daemons import package
from tests.inprocess import InProcessDaemon
from tests.models import write_tiny_gguf

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def test_openai_ids_are_the_first_stored_tag_and_usable_in_requests(
    fake_daemon: InProcessDaemon, tmp_path: Path
) -> None:
    """api.go ToOpenAI: `id` is the model's first tag as stored (`docker.io/ai/tiny:latest`), else its ID;
    http_handler.go handleOpenAIGetModels/handleOpenAIGetModel serve it on every OpenAI models route."""
    daemon = fake_daemon
    for listing in ("/engines/v1/models", "/v1/models", "/engines/llama.cpp/v1/models"):
        assert [m["id"] for m in daemon.http("GET", listing).json()["data"]] == ["docker.io/ai/tiny:latest"]
    for one in ("/engines/v1/models/tiny", "/v1/models/ai/tiny", "/engines/llama.cpp/v1/models/tiny"):
        assert daemon.http("GET", one).json()["id"] == "docker.io/ai/tiny:latest"
    answer = daemon.http(
        "POST", "/engines/v1/chat/completions", json={**CHAT, "model": "docker.io/ai/tiny:latest"}
    )
    assert answer.status_code == 200, answer.text
    # an untagged model is listed by its ID
    gguf = write_tiny_gguf(tmp_path / "untagged.gguf", seed=4)
    untagged = daemon.http("POST", "/models/package", json={"gguf": str(gguf)}).json()["id"]
    assert untagged in [m["id"] for m in daemon.http("GET", "/v1/models").json()["data"]]


def test_inspect_and_tag_find_a_model_by_the_last_component_of_its_name(
    fake_daemon: InProcessDaemon, tmp_path: Path
) -> None:
    """http_handler.go getLocalAPIModel/findModelByPartialName and manager.go Tag: when the reference finds
    nothing, the first model (store order) with a tag whose last path component, without its tag, is the
    reference exactly; only inspect and tag fall back so (not rm, not the OpenAI route)."""
    daemon = fake_daemon
    first = package(daemon, tmp_path, "hf.co/org/repo-gguf:Q4_K_M", seed=1)
    second = package(daemon, tmp_path, "other.example/team/repo-gguf:v2", seed=2)
    assert daemon.http("GET", "/models/repo-gguf").json()["id"] == first  # the first of two matches
    for missing in ("repo-gguf:Q4_K_M", "org/repo-gguf", "repo"):  # a name part only, exactly
        assert daemon.http("GET", f"/models/{missing}").status_code == 404
    tagged = daemon.http("POST", "/models/repo-gguf/tag", params={"repo": "mine/copy", "tag": "v1"})
    assert tagged.status_code == 201, tagged.text
    assert daemon.http("GET", "/models/mine/copy:v1").json()["id"] == first
    assert daemon.http("GET", "/engines/v1/models/repo-gguf").status_code == 404
    assert daemon.http("DELETE", "/models/repo-gguf").status_code == 404
    assert daemon.http("GET", "/models/other.example/team/repo-gguf:v2").json()["id"] == second


def test_tag_message_names_the_target(fake_daemon: InProcessDaemon) -> None:
    """http_handler.go handleTagModel: 201, `Model tagged successfully with %q` of `repo:tag` as given."""
    tagged = fake_daemon.http("POST", "/models/tiny/tag", params={"repo": "myorg/tiny", "tag": "v1"})
    assert tagged.status_code == 201
    assert tagged.json() == {
        "message": 'Model tagged successfully with "myorg/tiny:v1"',
        "target": "myorg/tiny:v1",
    }


def test_an_unknown_model_action_is_a_404(fake_daemon: InProcessDaemon) -> None:
    """http_handler.go handleModelAction: `unknown action %q`, 404."""
    answer = fake_daemon.http("POST", "/models/tiny/bogus")
    assert answer.status_code == 404
    assert 'unknown action \\"bogus\\"' in answer.text or 'unknown action "bogus"' in answer.text


def test_a_query_flag_without_a_value_is_true(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """http_handler.go parseBoolQueryParam: `?force` is true, what ParseBool refuses false."""
    daemon = fake_daemon
    daemon.http("POST", "/models/tiny/tag", params={"repo": "ai/tiny", "tag": "v2"}).raise_for_status()
    model_id = daemon.http("GET", "/models/tiny").json()["id"]
    assert daemon.http("DELETE", f"/models/{model_id}?force=maybe").status_code == 409  # false
    removed = daemon.http("DELETE", f"/models/{model_id}?force")
    assert removed.status_code == 200, removed.text
    assert daemon.http("GET", "/models").json() == []
    package(daemon, tmp_path, "tiny")
    assert daemon.http("GET", "/models/tiny?remote=maybe").status_code == 200  # false: read locally


def _raw(daemon: InProcessDaemon, method: str, path: str) -> http.client.HTTPResponse:
    """Sent as written: httpx would resolve the dot segments itself."""
    connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
    connection.request(method, path)
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


def test_paths_are_cleaned_as_go_s_servemux_cleans_them(fake_daemon: InProcessDaemon) -> None:
    """net/http ServeMux.findHandler: a path not in cleanPath's form is redirected there, 301 with the query
    kept, whatever the method; http.Redirect's small HTML body for GET. A path with `//` never gets there:
    routing.go NormalizedServeMux.ServeHTTP cleans it (path.Clean) and serves it."""
    daemon = fake_daemon
    for raw, clean in (
        ("/models/./tiny?x=1", "/models/tiny?x=1"),
        ("/engines/../models/tiny/", "/models/tiny/"),
    ):
        response = _raw(daemon, "GET", raw)
        assert (response.status, response.getheader("Location")) == (301, clean)
        assert response.getheader("Content-Type") == "text/html; charset=utf-8"
    connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
    connection.request("GET", "/models/./tiny")
    assert connection.getresponse().read() == b'<a href="/models/tiny">Moved Permanently</a>.\n\n'
    connection.close()


def test_a_double_slash_is_served_at_the_cleaned_path(fake_daemon: InProcessDaemon) -> None:
    """routing.go NormalizedServeMux.ServeHTTP: a path holding `//` is path.Clean'ed (dot segments and the
    trailing slash too) and served: a client whose base URL ends in `/` is answered, its POST kept a POST."""
    daemon = fake_daemon
    for raw in ("//models", "//models/", "/engines/../models//"):
        response = _raw(daemon, "GET", raw)
        assert response.status == 200, raw
    assert daemon.http("GET", "//models").json()[0]["tags"] == ["docker.io/ai/tiny:latest"]
    for path in ("//engines/v1/chat/completions", "/engines//v1/chat/completions", "//v1/chat/completions"):
        answer = daemon.http("POST", path, json={**CHAT, "model": "ai/tiny"})
        assert answer.status_code == 200, (path, answer.text)
        assert answer.json()["object"] == "chat.completion"


def test_errors_of_dmr_routes_are_http_error_s_text(fake_daemon: InProcessDaemon) -> None:
    """http_handler.go answers with http.Error (the message, a newline, text/plain, nosniff), ServeMux a path
    no route takes with NotFound's "404 page not found"; the OpenAI routes keep OpenAI's JSON error."""
    missing = fake_daemon.http("GET", "/models/absent")
    assert missing.status_code == 404 and "model not found" in missing.text and missing.text.endswith("\n")
    assert missing.headers["content-type"] == "text/plain; charset=utf-8"
    assert missing.headers["x-content-type-options"] == "nosniff"
    nowhere = fake_daemon.http("GET", "/nowhere")
    assert (nowhere.status_code, nowhere.text) == (404, "404 page not found\n")
    openai = fake_daemon.http("GET", "/engines/v1/models/absent")
    assert openai.status_code == 404 and openai.json()["error"]["message"]


def test_export_names_the_file(fake_daemon: InProcessDaemon) -> None:
    """http_handler.go handleExportModel: `Content-Disposition: attachment; filename=%q` of name + .tar."""
    exported = fake_daemon.http("GET", "/models/ai/tiny:latest/export")
    assert exported.status_code == 200
    assert exported.headers["content-disposition"] == 'attachment; filename="ai/tiny:latest.tar"'


def test_a_preflight_allows_credentials(fake_daemon: InProcessDaemon) -> None:
    """middleware/cors.go CorsMiddleware: an allowed origin's OPTIONS gets 204 with
    `Access-Control-Allow-Credentials: true`."""
    origin = fake_daemon.url  # the daemon's own origin is allowed
    answer = fake_daemon.http(
        "OPTIONS", "/models", headers={"Origin": origin, "Access-Control-Request-Method": "GET"}
    )
    assert answer.status_code == 204
    assert answer.headers["access-control-allow-credentials"] == "true"
    assert answer.headers["access-control-allow-origin"] == origin
