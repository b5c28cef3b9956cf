"""The `model` CLI prints what DMR's formatting code prints, for the verbs whose output people and scripts
read. The expected strings are worked out from DMR's code: its tablewriter setup (`cmd/cli/commands/
utils.go: newTable`: no borders, cells padded to the column width plus two spaces), go-units' CustomSize and
HumanDuration, Go's encoding/json.

Follows: `cmd/cli/commands/status.go`, `ps.go`, `df.go`, `unload.go`, `configure_show.go`, `version.go`,
`list.go` (filter, --openai, --openaiurl), `purge.go`.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.dmr_daemons import cli_env, package, run_cli
from tests.daemon import free_port
from tests.inprocess import InProcessDaemon


def test_status_text_and_json(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    env = cli_env(tmp_path, fake_daemon.url)
    text = run_cli(env, "status")
    assert text.returncode == 0, text.stderr
    assert text.stdout == (
        "Docker Model Runner is running\n\n"
        "BACKEND    STATUS   DETAILS           \n"
        "llama.cpp  Running  llama.cpp fake-1  \n"
    )
    document = run_cli(env, "status", "--json")
    assert document.stderr == ""  # Compose reads it with stderr merged
    assert document.stdout == (
        '{"running":true,"backends":{"llama.cpp":"Running: llama.cpp fake-1"},'
        '"kind":"Docker Engine (Manual Install)",'
        f'"endpoint":"{fake_daemon.url}/v1/","endpointHost":"{fake_daemon.url}/v1/"}}\n'
    )


def test_status_of_a_runner_without_our_cluster_route(tmp_path: Path) -> None:
    """DMR's own daemon has `GET /models` and `GET /engines/status` (pkg/inference/scheduling/
    http_handler.go) but not our `/engines/cluster`: `status` prints its table all the same."""

    class DmrLike(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            answers = {"/models": b"[]", "/engines/status": b'{"llama.cpp":"Running: llama.cpp b1"}'}
            body = answers.get(self.path)
            self.send_response(200 if body is not None else 404)
            body = body if body is not None else b"404 page not found\n"
            self.send_header("Content-Type", "application/json" if self.path in answers else "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), DmrLike)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = cli_env(tmp_path, f"http://127.0.0.1:{server.server_address[1]}")
        text = run_cli(env, "status")
        assert text.returncode == 0, text.stderr
        assert text.stdout == (
            "Docker Model Runner is running\n\n"
            "BACKEND    STATUS   DETAILS       \n"
            "llama.cpp  Running  llama.cpp b1  \n"
        )
        document = run_cli(env, "status", "--json")
        assert document.returncode == 0, document.stderr
        assert json.loads(document.stdout)["backends"] == {"llama.cpp": "Running: llama.cpp b1"}
    finally:
        server.shutdown()
        server.server_close()


def test_status_when_not_running(tmp_path: Path) -> None:
    """status.go RunE and desktop.go Status: a runner named (MODEL_RUNNER_HOST) that does not answer is
    handleClientError(err, "Failed to get Docker Model Runner status") with handleQueryError's "error
    querying /models", text or --json; DMR's "not running" is only its 503 (tests/integration/
    test_engines.py: no local daemon started)."""
    url = f"http://127.0.0.1:{free_port()}"
    env = cli_env(tmp_path, url)
    for args in (["status"], ["status", "--json"]):
        failed = run_cli(env, *args)
        assert failed.returncode == 1 and failed.stdout == ""
        assert failed.stderr.startswith(
            "Failed to get Docker Model Runner status: error querying /models: "
            f"cannot reach the model runner at {url}: "
        )


def test_status_table_order_follows_parse_status() -> None:
    """status.go: Running < Error < Not Installed < Installing, then by name; ParseStatus splits "X: y"."""
    from modelrunner.cli.engines import backend_status_table, parse_status

    assert parse_status("") == ("Not Installed", "")
    assert parse_status("Running: llama.cpp b1") == ("Running", "llama.cpp b1")
    assert parse_status("Installing") == ("Installing", "")
    assert parse_status("weird") == ("Error", "weird")
    table = backend_status_table(
        {"vllm": "Not Installed: no vllm", "mlx": "Installing", "b": "Error: x", "a": "Running: y", "c": ""}
    )
    assert [line.split()[0] for line in table.splitlines()[1:]] == ["a", "b", "c", "vllm", "mlx"]


def test_ps_table(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    env = cli_env(tmp_path, fake_daemon.url)
    assert run_cli(env, "ps").stdout == "MODEL NAME  BACKEND  MODE  UNTIL  \n"
    body = {"model": "ai/tiny:latest", "messages": [{"role": "user", "content": "hi"}]}
    assert fake_daemon.http("POST", "/engines/v1/chat/completions", json=body).status_code == 200
    # the default keep-alive (5m0s), just used: HumanDuration of a little under 5 minutes
    assert run_cli(env, "ps").stdout == (
        "MODEL NAME  BACKEND    MODE        UNTIL               \n"
        "tiny        llama.cpp  completion  4 minutes from now  \n"
    )
    run_cli(env, "configure", "--keep-alive", "-1", "tiny")

    def loaded() -> bool:  # not loading any more: a CLI that starts in ~40 ms could see "Loading..."
        return any(not runner.get("loading") for runner in fake_daemon.ps())

    fake_daemon.wait_for(loaded, "the configured model to load again")
    assert run_cli(env, "ps").stdout.splitlines()[1].split()[-1] == "Forever"


def test_ps_until_column() -> None:
    """formatUntil (ps.go), from a BackendStatus as our daemon writes it."""
    from modelrunner.cli.inference import until as until_of
    from modelrunner.client_types import Runner

    def until(doc: dict[str, Any], now: float) -> str:
        return until_of(Runner.from_json(doc), now)

    now = 1_800_000_000.0
    used = "2027-01-15T08:00:00Z"  # = now
    assert until({"loading": True}, now) == "Loading..."
    assert until({"keep_alive": "-1", "last_used": used}, now) == "Forever"
    assert until({"keep_alive": "1h0m0s", "in_use": True, "last_used": "0001-01-01T00:00:00Z"}, now) == (
        "About an hour from now"
    )
    assert until({"keep_alive": "10m0s", "last_used": "2027-01-15T07:58:00Z"}, now) == "8 minutes from now"
    assert until({"keep_alive": "1m0s", "last_used": "2027-01-15T07:50:00Z"}, now) == "Expiring"
    assert until({"last_used": "2027-01-15T07:59:30Z"}, now) == "4 minutes from now"  # DMR's default 5m


def test_df(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    out = run_cli(cli_env(tmp_path, fake_daemon.url), "df").stdout
    lines = out.splitlines()
    assert lines[0] == "TYPE    SIZE      "
    assert re.fullmatch(r"Models  \d+\.\d\dkB  ", lines[1]), lines
    assert len(lines) == 2  # no engine row: the fake engine takes no space


def test_custom_size_as_go_units() -> None:
    from modelrunner.cli.dmrformat import custom_size

    assert [custom_size(n) for n in (0, 999, 1000, 1_234_567, 4_920_000_000, 10**30)] == [
        "0.00B",
        "999.00B",
        "1.00kB",
        "1.23MB",
        "4.92GB",
        "1000000.00YB",
    ]


def test_unload_messages(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    env = cli_env(tmp_path, fake_daemon.url)
    assert run_cli(env, "unload", "--all").stdout == "No models are running.\n"
    assert run_cli(env, "unload", "tiny").stdout == "No such model(s) running.\n"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    fake_daemon.http("POST", "/engines/v1/chat/completions", json=body)
    assert run_cli(env, "unload", "tiny").stdout == "Unloaded 1 model(s).\n"
    both = run_cli(env, "unload", "--all", "tiny")  # unload.go's Args: DMR's main exits 1
    assert both.returncode == 1 and "does not take MODEL when --all is specified" in both.stderr


def test_purge_unloads_first(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """purge.go: Unload{All: true}, then DELETE /models/purge."""
    env = cli_env(tmp_path, fake_daemon.url)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    fake_daemon.http("POST", "/engines/v1/chat/completions", json=body)
    result = run_cli(env, "purge", "--force")
    assert result.returncode == 0, result.stderr
    assert fake_daemon.ps() == [] and fake_daemon.http("GET", "/models").json() == []


def test_configure_show_is_go_s_marshal_indent(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    env = cli_env(tmp_path, fake_daemon.url)
    assert run_cli(env, "configure", "show").stdout == "[]\n"
    assert run_cli(env, "configure", "--context-size", "1024", "--keep-alive", "1h", "tiny").returncode == 0
    model_id = fake_daemon.http("GET", "/models/tiny").json()["id"]
    assert run_cli(env, "configure", "show", "tiny").stdout == (
        "[\n"
        "  {\n"
        '    "Backend": "llama.cpp",\n'
        '    "Model": "docker.io/ai/tiny:latest",\n'
        f'    "ModelID": "{model_id}",\n'
        '    "Mode": "completion",\n'
        '    "Config": {\n'
        '      "context-size": 1024,\n'
        '      "keep_alive": "1h0m0s"\n'
        "    }\n"
        "  }\n"
        "]\n"
    )


def test_go_json_escapes_as_go() -> None:
    from modelrunner.artifact.gojson import dumps_text

    assert dumps_text({"a": "<b>&é\u2028"}) == '{"a":"\\u003cb\\u003e\\u0026é\\u2028"}'
    assert dumps_text([{"k": [1]}], indent="  ") == '[\n  {\n    "k": [\n      1\n    ]\n  }\n]'


def test_version_layout(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    out = run_cli(cli_env(tmp_path, fake_daemon.url), "version").stdout.splitlines()
    assert out[0] == "Client:" and out[1].startswith(" Version:    ") and out[2].startswith(" OS/Arch:    ")
    assert out[3:] == ["", "Server:", " Version:    0.1.0", " Engine:     Docker Engine (Manual Install)"]


def test_ls_filter_is_the_exact_repository_after_adding_ai(
    fake_daemon: InProcessDaemon, tmp_path: Path
) -> None:
    """list.go: normalizeModelFilter adds `ai/` to a name without `/`; matchesModelFilter compares the
    repository (or the whole reference when the filter has a tag), and keeps only the matching tags."""
    daemon = fake_daemon
    package(daemon, tmp_path, "myorg/tiny", seed=1)
    package(daemon, tmp_path, "tinyllama", seed=2)
    daemon.http("POST", "/models/tiny/tag?repo=ai/tiny&tag=v2").raise_for_status()
    env = cli_env(tmp_path, daemon.url)

    def names(*args: str) -> list[str]:
        return [line.split()[0] for line in run_cli(env, "ls", *args).stdout.splitlines()[1:]]

    assert names("tiny") == ["tiny", "tiny:v2"]
    assert names("tiny:v2") == ["tiny:v2"]
    assert names("ai/tiny") == ["tiny", "tiny:v2"]
    assert names("myorg/tiny") == ["myorg/tiny"]
    assert names("tin") == []
    # issue 37 item 8: the help says so (it said "contains", which `ls smol` belied)
    shown = " ".join(run_cli(env, "ls", "--help").stdout.split())
    assert "the whole name, not a part of it (`smollm2` is ai/smollm2" in shown and "contain" not in shown
    [model] = json.loads(run_cli(env, "ls", "--json", "tiny:v2").stdout)
    assert model["tags"] == ["docker.io/ai/tiny:v2"]


def test_ls_openai_and_openaiurl(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    env = cli_env(tmp_path, fake_daemon.url)
    listing = run_cli(env, "ls", "--openai")
    assert listing.stdout.startswith('{\n    "object": "list",\n    "data": [\n')  # ToStandardJSON
    assert [m["id"] for m in json.loads(listing.stdout)["data"]] == [
        "docker.io/ai/tiny:latest"
    ]  # DMR's ToOpenAI: the first stored tag
    assert json.loads(run_cli(env, "ls", "--openai", "absent").stdout)["data"] == []
    refused = run_cli(env, "ls", "--openai", "-q")
    assert refused.returncode == 1 and "--quiet flag cannot be used with --openai flag" in refused.stderr
    # any OpenAI endpoint: here our own, reached by its OpenAI URL
    external = run_cli(cli_env(tmp_path), "ls", "--openaiurl", f"{fake_daemon.url}/engines/v1")
    assert external.returncode == 0, external.stderr
    header, row = external.stdout.splitlines()
    # the endpoint's own ids, as it lists them (ours: DMR's, the first stored tag)
    assert re.fullmatch(r"MODEL NAME +CREATED +", header) and header.index("CREATED") == len(
        "docker.io/ai/tiny:latest  "
    )
    assert re.fullmatch(
        r"docker\.io/ai/tiny:latest  (\d+ \w+|Less than a second|About an? \w+) ago +", row
    ), row


def test_endpoints_for_containers() -> None:
    """status.go's jsonStatus: on Docker Engine containers reach the runner on the bridge gateway
    (`endpoint`), this machine on loopback (`endpointHost`); a daemon named by URL is the manual kind."""
    from modelrunner.cli.engines import endpoints
    from modelrunner.client import Client
    from modelrunner.client_types import EnginesInfo

    local = Client("http://127.0.0.1:12434")
    bridge = EnginesInfo.from_json({"extra_listen": ["172.17.0.1:12434"]})
    assert endpoints(local, False, bridge) == (
        "Docker Engine",
        "http://172.17.0.1:12434/v1/",
        "http://127.0.0.1:12434/v1/",
    )
    for loopback in ("127.0.0.2:12434", "[::1]:12434"):
        on_loopback = EnginesInfo.from_json({"extra_listen": [loopback]})
        assert endpoints(local, False, on_loopback)[0] == "Docker Engine (Manual Install)"
    named = endpoints(Client("http://gpu.lan:12434"), True, bridge)
    assert named == ("Docker Engine (Manual Install)", "http://gpu.lan:12434/v1/", "http://gpu.lan:12434/v1/")


def test_stop_runner_with_models(tmp_path: Path) -> None:
    """stop-runner.go: `--models` also removes the model storage. The daemon is the one the CLI starts.
    Beyond DMR (issue 37): it asks first, as purge.go does; declined, nothing is done."""
    from tests.models import write_tiny_gguf

    home = tmp_path / "home"
    env = cli_env(tmp_path, MODEL_RUNNER_PORT=str(free_port()), MODEL_RUNNER_HOME=str(home))
    try:
        packaged = run_cli(env, "package", "--gguf", str(write_tiny_gguf(tmp_path / "t.gguf")), "tiny")
        assert packaged.returncode == 0, packaged.stderr
        assert any(p.is_file() for p in (home / "models" / "blobs").rglob("*"))
        declined = run_cli(env, "stop-runner", "--models", stdin="N\n")
        assert (declined.returncode, declined.stderr) == (0, "")
        assert declined.stdout.endswith("[y/N] Operation cancelled.\n")
        assert any(p.is_file() for p in (home / "models" / "blobs").rglob("*"))
        assert run_cli(env, "ls", "-q").stdout != ""  # still running
    finally:
        stopped = run_cli(env, "stop-runner", "--models", stdin="y\n")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith("WARNING! This will remove the entire models directory.\n")
    assert "Removed every model" in stopped.stdout and "has stopped" in stopped.stdout
    assert not any(p.is_file() for p in (home / "models" / "blobs").rglob("*"))
    assert "not running" in run_cli(env, "stop-runner").stdout


def test_uninstall_runner_with_models(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    result = run_cli(cli_env(tmp_path, fake_daemon.url), "uninstall-runner", "--models", "--force")
    assert result.returncode == 0, result.stderr
    assert "Removed every model from the store" in result.stdout
    assert fake_daemon.http("GET", "/models").json() == []


def test_bench_timeout(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    env = cli_env(tmp_path, fake_daemon.url)
    refused = run_cli(env, "bench", "tiny", "--timeout=-1s")
    # an error of bench.go's RunE: printed as it is by DMR's main, exit 1
    assert (refused.returncode, refused.stderr) == (
        1,
        "--timeout must be a positive duration such as 30s or 5m\n",
    )
    ran = run_cli(
        env, "bench", "tiny", "--concurrency", "1", "--duration", "1s", "--timeout", "10s", "--json"
    )
    assert ran.returncode == 0, ran.stderr
    [level] = json.loads(ran.stdout)["results"]
    assert level["Concurrency"] == 1 and level["Requests"] == len(level["TokenCounts"]) > 0


def test_package_format(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """package.go: --format docker|cncf; the builder refuses --context-size with cncf."""
    from tests.models import write_tiny_gguf

    env = cli_env(tmp_path, fake_daemon.url)
    gguf = str(write_tiny_gguf(tmp_path / "p.gguf", seed=6))
    invalid = run_cli(env, "package", "--gguf", gguf, "--format", "onnx", "p")
    assert (
        invalid.returncode == 1
        and 'invalid --format value "onnx": must be "docker" or "cncf"' in invalid.stderr
    )
    both = run_cli(env, "package", "--gguf", gguf, "--format", "cncf", "--context-size", "64", "p")
    assert both.returncode == 1
    assert "--context-size is not supported with --format cncf" in both.stderr
    assert run_cli(env, "package", "--gguf", gguf, "--format", "docker", "p").returncode == 0
    cncf = run_cli(env, "package", "--gguf", gguf, "--format", "cncf", "p:cncf")
    assert cncf.returncode == 0, cncf.stderr
    assert cncf.stdout == "" and "Model loaded successfully" in cncf.stderr
    models = {m["tags"][0]: m for m in fake_daemon.http("GET", "/models").json()}
    assert models["docker.io/ai/p:cncf"]["id"] != models["docker.io/ai/p:latest"]["id"]
    assert models["docker.io/ai/p:cncf"]["config"]["format"] == "gguf"


HEX64 = "0123456789abcdef" * 4


@pytest.mark.parametrize(
    ("full", "expected"),
    [
        ("docker.io/ai/smollm2:latest", "smollm2"),
        ("docker.io/ai/smollm2:360M-Q4_K_M", "smollm2:360M-Q4_K_M"),
        ("docker.io/myorg/model:latest", "myorg/model"),
        ("ai/smollm2", "smollm2"),
        ("huggingface.co/org/repo:latest", "huggingface.co/org/repo"),
        ("huggingface.co/org/repo:Q4_K_M", "huggingface.co/org/repo:Q4_K_M"),
        ("gemma3:latest", "gemma3"),
        ("myorg/gemma3:latest", "myorg/gemma3"),
        ("hf.co/bartowski/model:latest", "hf.co/bartowski/model"),
        ("localhost:5000/ai/x:latest", "localhost:5000/ai/x"),
        (f"docker.io/ai/x@sha256:{HEX64}", f"x@sha256:{HEX64}"),
    ],
)
def test_display_name(full: str, expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # follows cmd/cli/commands/utils.go: stripDefaultsFromModelName (the names of ls, ps, rm)
    from modelrunner.display import display_name

    monkeypatch.delenv("DEFAULT_REGISTRY", raising=False)
    assert display_name(full) == expected
    if full.startswith("docker.io/"):
        assert display_name("index.docker.io/" + full.removeprefix("docker.io/")) == expected


def test_display_name_with_another_default_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    # follows cmd/cli/commands/utils.go: a custom DEFAULT_REGISTRY replaces the Docker Hub prefixes
    from modelrunner.display import display_name

    monkeypatch.setenv("DEFAULT_REGISTRY", "registry.local:5000")
    assert display_name("registry.local:5000/ai/x:latest") == "x"
    assert display_name("docker.io/ai/x:latest") == "docker.io/ai/x"
