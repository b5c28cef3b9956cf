"""`model context`: named runner endpoints in DMR's file, which both CLIs read and write.

Follows: `cmd/cli/pkg/modelctx/store.go` (`<docker config>/model/contexts.json`, `contexts.lock`, the JSON
layout, name rules, "default" reserved, the active context cannot be removed), `cmd/cli/commands/
context.go` (messages, the `ls` table with the synthetic "default" row, `inspect`'s four-space JSON),
`cmd/cli/desktop/context.go` (the active context's host and TLS settings; MODEL_RUNNER_HOST wins).
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

from tests.conformance.dmr_daemons import cli_env, run_cli
from tests.conformance.gotypes import go_decode
from tests.inprocess import InProcessDaemon

# modelctx.contextFile / ContextConfig / TLSConfig, as DMR's reader decodes them
CONTEXT_FILE = {
    "version": "int",
    "current": "string",
    "contexts": (
        "map",
        {
            "host": "string",
            "tls": {"enabled": "bool", "skipVerify": "bool", "caCert": "string"},
            "description": "string",
            "createdAt": "time",
        },
    ),
}


def test_create_ls_use_inspect_rm(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    created = run_cli(env, "context", "create", "lab", "--host", fake_daemon.url, "--description", "the lab")
    assert created.stdout == 'Context "lab" created.\n', created.stderr
    width = len(fake_daemon.url)  # the HOST column is as wide as its widest cell
    assert run_cli(env, "context", "ls").stdout == (
        f"NAME     {'HOST':<{width}}  DESCRIPTION                   CURRENT  \n"
        f"default  {'(auto-detect)':<{width}}  Auto-detected Docker context  *        \n"
        f"lab      {fake_daemon.url}  the lab                                \n"
    )
    assert run_cli(env, "context", "use", "lab").stdout == 'Current context is now "lab".\n'
    # every verb now talks to the lab's daemon
    assert json.loads(run_cli(env, "ls", "--json").stdout)[0]["tags"] == ["docker.io/ai/tiny:latest"]
    [shown] = json.loads(run_cli(env, "context", "inspect", "lab").stdout)
    assert shown["name"] == "lab" and shown["host"] == fake_daemon.url and shown["tls"] == {"enabled": False}
    assert run_cli(env, "context", "inspect", "default").stdout == (
        "[\n    {\n"
        '        "name": "default",\n'
        '        "host": "(auto-detect)",\n'
        '        "tls": {\n            "enabled": false\n        },\n'
        '        "description": "Auto-detected Docker context",\n'
        '        "createdAt": "0001-01-01T00:00:00Z"\n'
        "    }\n]\n"
    )
    active = run_cli(env, "context", "rm", "lab")
    assert active.returncode == 1 and 'context "lab" is currently active' in active.stderr.replace("'", '"')
    run_cli(env, "context", "use", "default")
    assert run_cli(env, "context", "rm", "lab").stdout == 'Context "lab" removed.\n'

    folder = tmp_path / "docker" / "model"
    assert (folder / "contexts.lock").exists()
    assert stat.S_IMODE((folder / "contexts.json").stat().st_mode) == 0o600
    assert json.loads((folder / "contexts.json").read_text()) == {"version": 1, "contexts": {}}


def test_the_file_is_dmr_s(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked here")
    run_cli(
        env,
        "context",
        "create",
        "secure",
        "--host",
        "https://gpu.example:12444",
        "--tls",
        "--tls-ca-cert",
        str(ca),
    )
    run_cli(env, "context", "create", "keyed", "--host", "http://10.0.0.9:12434", "--api-key", "k")
    run_cli(env, "context", "use", "keyed")
    raw = (tmp_path / "docker" / "model" / "contexts.json").read_text()
    assert raw.startswith(
        '{\n    "version": 1,\n    "current": "keyed",\n    "contexts": {\n'
    )  # MarshalIndent
    document = json.loads(raw)
    go_decode(document, CONTEXT_FILE)  # DMR's reader: apiKey is an unknown field, which Go skips
    assert document["contexts"]["secure"]["tls"] == {"enabled": True, "caCert": str(ca)}
    assert document["contexts"]["keyed"]["apiKey"] == "k"


def test_a_file_dmr_wrote_is_read_and_its_unknown_fields_kept(
    fake_daemon: InProcessDaemon, tmp_path: Path
) -> None:
    folder = tmp_path / "docker" / "model"
    folder.mkdir(parents=True)
    (folder / "contexts.json").write_text(
        json.dumps(
            {
                "version": 1,
                "current": "remote",
                "contexts": {
                    "remote": {
                        "host": fake_daemon.url,
                        "tls": {"enabled": False},
                        "description": "made by docker model context create",
                        "createdAt": "2026-07-22T10:11:12.123456789Z",
                        "futureField": {"x": 1},
                    }
                },
                "futureTopLevel": True,
            },
            indent=4,
        )
    )
    env = cli_env(tmp_path)
    assert run_cli(env, "ls", "-q").stdout.strip() == fake_daemon.http("GET", "/models").json()[0]["id"][7:19]
    run_cli(env, "context", "create", "other", "--host", "http://127.0.0.1:1")
    document = json.loads((folder / "contexts.json").read_text())
    assert document["futureTopLevel"] is True
    assert document["contexts"]["remote"]["futureField"] == {"x": 1}
    assert document["contexts"]["remote"]["createdAt"] == "2026-07-22T10:11:12.123456789Z"


def test_model_runner_host_wins_over_the_context(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    run_cli(env, "context", "create", "dead", "--host", "http://127.0.0.1:1")
    run_cli(env, "context", "use", "dead")
    assert "cannot reach the model runner at http://127.0.0.1:1" in run_cli(env, "ls").stderr
    env["MODEL_RUNNER_HOST"] = fake_daemon.url
    assert run_cli(env, "ls", "--json").returncode == 0
    assert (
        f'Warning: MODEL_RUNNER_HOST="{fake_daemon.url}" overrides the active context.'
        in run_cli(env, "context", "ls").stderr
    )


def test_bad_context_commands(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    cases = [
        (["context", "create", "default", "--host", "http://x:1"], 'context name "default" is reserved'),
        (["context", "create", "-bad", "--host", "http://x:1"], ""),
        (["context", "create", "has/slash", "--host", "http://x:1"], "invalid context name"),
        (["context", "create", "nohost"], "--host is required"),
        (["context", "create", "ftp", "--host", "ftp://x:1"], "unsupported scheme"),
        (["context", "create", "bare", "--host", "x:1"], "must include scheme and host"),
        (["context", "create", "ca", "--host", "http://x:1", "--tls-ca-cert", "/absent.pem"], "cannot read"),
        (["context", "use", "absent"], "not found"),
        (["context", "rm", "absent"], "not found"),
        (["context", "rm", "default"], "cannot be removed"),
        (["context", "inspect", "absent"], "not found"),
    ]
    for args, needle in cases:
        result = run_cli(env, *args)
        assert result.returncode == 1, args  # cobra: every RunE error and usage error exits 1
        assert needle in result.stderr, (args, result.stderr)
    run_cli(env, "context", "create", "dup", "--host", "http://x:1")
    duplicate = run_cli(env, "context", "create", "dup", "--host", "http://x:2")
    assert duplicate.returncode == 1 and "already exists" in duplicate.stderr
