"""`model run` as DMR's: the chat requests it builds (files included with @, images attached as data URIs,
`\"\"\"` and `'''` blocks), its commands, `--openaiurl`, `--detach`, `--debug`; and, beyond DMR, errors that
are shown instead of hidden (issue 12): the auto-pull's progress and failure, an error mid-answer that leaves
the chat going.

Follows: `cmd/cli/commands/run.go` (readline loop, /help, /set, multi-line input), `images.go`
(extractFileInclusions, processFileInclusions, extractImagePaths, encodeImageToDataURL),
`cmd/cli/desktop/desktop.go` (ChatWithMessagesContext: image parts first, then the text).
"""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest

from modelrunner.cli.prompt_files import attach_images, include_files, user_message
from tests.conformance.dmr_daemons import FakeDaemons, cli_env, package, run_cli
from tests.conformance.openai_endpoint import OpenAIEndpoint
from tests.daemon import free_port
from tests.inprocess import InProcessDaemon
from tests.registry import Registry
from tests.terminal import Terminal

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 32


def test_file_inclusion_and_images_as_dmr_builds_the_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("NOTES")
    (tmp_path / "my file.md").write_text("SPACED")
    (tmp_path / "pic.png").write_bytes(PNG)
    assert include_files("sum up @notes.txt please") == "sum up NOTES please"
    assert include_files('read @"my file.md" and @./notes.txt') == "read SPACED and NOTES"
    assert include_files("mail me@example.com") == "mail me@example.com"  # not a file: left as typed
    assert include_files("see @pic.png") == "see @pic.png"  # images are attached, not inlined
    text, images = attach_images(f"what is in {tmp_path}/pic.png ?")
    assert text == "what is in  ?"
    assert images == ["data:image/png;base64," + base64.b64encode(PNG).decode()]
    assert attach_images("a ./absent.png here") == ("a ./absent.png here", [])
    message = user_message("describe './pic.png' from @notes.txt")
    assert message["role"] == "user"
    assert message["content"] == [
        {"type": "image_url", "image_url": {"url": images[0]}},
        {"type": "text", "text": "describe  from NOTES"},
    ]


def test_one_shot_run_against_an_openai_url(endpoint: OpenAIEndpoint, tmp_path: Path) -> None:
    (tmp_path / "ctx.txt").write_text("the context")
    env = cli_env(tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "modelrunner",
            "run",
            "--openaiurl",
            endpoint.url,
            "--debug",
            "m",
            "about @ctx.txt",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        input="piped text",
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Running model m with prompt about @ctx.txt\n\npiped text\nfirst answer\n"
    [request] = endpoint.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["body"]["model"] == "m" and request["body"]["stream"] is True
    assert request["body"]["messages"] == [{"role": "user", "content": "about the context\n\npiped text"}]
    detach = run_cli(env, "run", "--openaiurl", endpoint.url, "-d", "m")
    # run.go's RunE error: printed as it is by DMR's main, exit 1
    assert detach.returncode == 1 and "--detach flag cannot be used with --openaiurl flag" in detach.stderr


def test_interactive_chat_keeps_going_after_an_error(endpoint: OpenAIEndpoint, tmp_path: Path) -> None:
    endpoint.script = ["error", "ok", "ok"]
    env = cli_env(tmp_path, TERM="dumb")
    with Terminal(["run", "--openaiurl", endpoint.url, "m"], env, tmp_path) as term:
        term.expect("> ")
        term.send("hello")
        assert "Failed to generate a response: the engine stopped" in term.expect("> ")
        term.send("/help")
        assert "Available Commands:" in term.expect("> ")
        term.send("/? set")
        assert "/set num_ctx <n>" in term.expect("> ")
        term.send("/set system be brief")
        assert "Set system message." in term.expect("> ")
        term.send("'''")
        term.send("line one")
        term.send("line two'''")
        assert "first answer" in term.expect("> ")
        term.send('"""one line"""')
        term.expect("first answer")
        term.send("/nonsense")
        assert "Unknown command '/nonsense'. Type /? for help" in term.expect("> ")
        term.send("/bye")
        assert term.close() == 0
    # the failed turn is not in the history; the system message leads; a block's lines are joined by
    # newlines and the text trimmed (processImagesInPrompt's TrimSpace)
    assert [r["body"]["messages"] for r in endpoint.requests] == [
        [{"role": "user", "content": "hello"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "line one\nline two"}],
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "line one\nline two"},
            {"role": "assistant", "content": "first answer"},
            {"role": "user", "content": "one line"},
        ],
    ]


def test_a_crashing_engine_does_not_end_the_chat(fake_daemons: FakeDaemons, tmp_path: Path) -> None:
    """Through our daemon: the engine dies after one chunk; the daemon reports it in the stream."""
    daemon = fake_daemons.start({"FAKE_CHUNKS": "5", "FAKE_CRASH_AFTER": "1"})
    term = Terminal(["run", "tiny"], cli_env(tmp_path, daemon.url, TERM="dumb"), tmp_path)
    term.expect("> ")
    term.send("hello")
    assert "Failed to generate a response" in term.expect("> ")
    term.send("again")
    assert "Failed to generate a response" in term.expect("> ")
    term.send("/bye")
    assert term.close() == 0


def test_run_pulls_a_missing_model_and_shows_it(
    fake_daemon: InProcessDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-empty"))
    registry = Registry(tmp_path / "registry").start()
    try:
        ref = f"{registry.host}/run/tiny:v1"
        package(fake_daemon, tmp_path, ref, seed=4)
        assert fake_daemon.http("POST", f"/models/{ref}/push").status_code == 200
        fake_daemon.http("DELETE", f"/models/{ref}").raise_for_status()
        env = cli_env(tmp_path, fake_daemon.url)
        result = run_cli(env, "run", ref, "hi")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"Unable to find model '{ref}' locally. Pulling from the server.\n")
        assert "Downloaded" in result.stdout and "Model pulled successfully" in result.stdout
        assert result.stdout.endswith("t0 t1 t2 \n")

        missing = run_cli(env, "run", f"{registry.host}/run/absent:v1", "hi")
        assert missing.returncode == 1
        assert "Pulling from the server" in missing.stdout
        assert missing.stderr.startswith("Failed to pull model: pulling ")
        assert "not found" in missing.stderr.lower() and "model not found" not in missing.stderr
    finally:
        registry.stop()


def test_run_stops_when_the_pull_fails(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    env = cli_env(tmp_path, fake_daemon.url)
    result = run_cli(env, "run", f"127.0.0.1:{free_port()}/nowhere/model:v1", "hi")
    assert result.returncode == 1
    assert result.stdout.startswith("Unable to find model")  # run.go: cmd.Println
    assert result.stderr.strip().splitlines()[-1].startswith("Failed to pull model: ")  # pullModel
    assert fake_daemon.ps() == []  # nothing was run


def test_detach_loads_only(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    result = run_cli(cli_env(tmp_path, fake_daemon.url), "run", "-d", "--debug", "tiny")
    assert result.returncode == 0 and result.stdout == "Running model tiny\nModel tiny loaded successfully\n"
    [runner] = fake_daemon.ps()
    assert runner["model_name"] == "tiny"
    bad = run_cli(cli_env(tmp_path, fake_daemon.url), "run", "--color", "sometimes", "tiny", "hi")
    assert (bad.returncode, bad.stderr) == (1, '--color must be one of: auto, yes, no (got "sometimes")\n')
