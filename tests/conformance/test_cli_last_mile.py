"""The CLI where a newcomer meets it first (issue 37): a mistyped verb, the usage errors DMR words itself, a
tag or a file checked before anything is sent, a pull refused in DMR's words, an answer cut by its token
limit, another program on the runner's port, and verbs that remove every model asking first.

Follows: spf13/cobra `command.go` (Find's legacyArgs: `unknown command %q for %q`, findSuggestions' "Did you
mean this?", SuggestFor) and `command.go` ValidateRequiredFlags (`required flag(s) %q not set`);
docker/model-runner `cmd/cli/commands/unload.go` (its Args), `configure.go` (its Args), `configure_show.go`
(cobra.MaximumNArgs), `requests.go` (PreRunE), `run.go` (newRunCmd: PreRunE's --color check, "Unable to find
model" through cmd.Println, pullModel; readline's Placeholder), `pull.go` (pullModel: handleClientError
"Failed to pull model"; compose.go's up sends the same), `cmd/cli/desktop/desktop.go` (Pull: `pulling %s
failed with status %s: %s`), `tag.go` (tagModel: reference.NewTag's error as `invalid tag: ...`), `package.go`
(RunE: "Failed to package model", `package model: add gguf file: ...`), `compose.go` (newUpCommand:
MarkFlagRequired("model")), `purge.go` (the question stop-runner and uninstall-runner --models ask too),
`pkg/inference/scheduling/scheduler.go` (ConfigureRunner: a model not in the store is taken, so the check is
the CLI's).
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelrunner.cli import unknown_command
from modelrunner.cli.distribution import close_local_model
from modelrunner.client import Client
from tests.conformance.dmr_daemons import cli_env, run_cli
from tests.conformance.openai_endpoint import OpenAIEndpoint
from tests.daemon import free_port
from tests.docker_cli import docker, plugin_env
from tests.inprocess import InProcessDaemon
from tests.registry import Registry
from tests.terminal import Terminal


def closed(tmp_path: Path) -> dict[str, str]:
    """A CLI environment whose runner does not answer: what is checked before it is asked fails alone."""
    return cli_env(tmp_path, f"http://127.0.0.1:{free_port()}")


# -- a mistyped verb -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("word", "suggested"),
    [("lst", ["list", "ls"]), ("pul", ["pull"]), ("cp", ["tag"]), ("create", ["package"]), ("zzz", [])],
)
def test_an_unknown_verb_is_an_error_with_cobras_suggestions(
    tmp_path: Path, word: str, suggested: list[str]
) -> None:
    """cobra: `unknown command "lst" for "model"`, then "Did you mean this?" with the close verbs (Ollama's
    `cp` and `create` suggest ours, as SuggestFor would); exit 1, nothing on stdout."""
    result = run_cli(closed(tmp_path), word, "x")
    assert (result.returncode, result.stdout) == (1, "")
    did_you_mean = "Did you mean this?\n" + "".join(f"\t{verb}\n" for verb in suggested) + "\n"
    assert result.stderr == (
        f'unknown command "{word}" for "model"\n\n'
        + (did_you_mean if suggested else "")
        + "Run 'model --help' for usage.\n"
    )


def test_an_unknown_verb_through_docker(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """The same, with the command path `docker model` (the help is no longer printed with exit 0)."""
    result = docker(plugin_env(tmp_path, fake_daemon.url), "model", "lst")
    assert (result.returncode, result.stdout) == (1, "")
    unknown = 'unknown command "lst" for "docker model"\n\n'
    assert result.stderr.startswith(unknown + "Did you mean this?\n\tlist\n")
    assert result.stderr.endswith("Run 'docker model --help' for usage.\n")


def test_help_is_cobras_help_command(tmp_path: Path) -> None:
    """cobra adds `help [COMMAND]`: not an unknown verb, but the help of the root or of that command."""
    env = closed(tmp_path)
    assert run_cli(env, "help").stdout == run_cli(env, "--help").stdout
    listed = run_cli(env, "help", "ls")
    assert (listed.returncode, listed.stdout) == (0, run_cli(env, "ls", "--help").stdout)


def test_hidden_verbs_are_not_suggested() -> None:
    """`compose` is hidden (DMR's c.Hidden): cobra suggests no hidden command."""
    assert "compose" not in unknown_command("compse", "model")


def test_help_lists_no_hidden_verb(tmp_path: Path) -> None:
    """argparse prints a parser added with help=SUPPRESS as `compose ==SUPPRESS==`; DMR hides it."""
    shown = run_cli(closed(tmp_path), "--help")
    assert shown.returncode == 0
    assert "SUPPRESS" not in shown.stdout and "compose" not in shown.stdout
    assert "    list (ls) " in shown.stdout


# -- usage errors: DMR's bare message, exit 1 -------------------------------------------------------------


UNLOAD_USAGE = "Usage:  model unload (MODEL [MODEL ...] [--backend BACKEND] | --all)"


@pytest.mark.parametrize(
    ("args", "stderr"),
    [
        (
            ["unload"],
            f"'model unload' requires MODEL unless --all is specified.\n\n{UNLOAD_USAGE}\n\n"
            "See 'model unload --help' for more information.\n",
        ),
        (
            ["unload", "--all", "m"],
            f"'model unload' does not take MODEL when --all is specified.\n\n{UNLOAD_USAGE}\n\n"
            "See 'model unload --help' for more information.\n",
        ),
        (
            ["configure", "a", "b"],
            "Exactly one model must be specified, got 2: [a b]\n\n"
            "See 'model configure --help' for more information\n",
        ),
        (
            ["configure", "--context-size", "10"],
            "Exactly one model must be specified, got 0: []\n\n"
            "See 'model configure --help' for more information\n",
        ),
        (
            ["configure", "a", "b", "--", "--threads", "2"],
            "Exactly one model must be specified before --, got 2\n\n"
            "See 'model configure --help' for more information\n",
        ),
        (["configure", "show", "a", "b"], "accepts at most 1 arg(s), received 2\n"),
        (["requests", "--include-existing"], "--include-existing can only be used with --follow\n"),
        (["run", "--color", "bogus", "m", "hi"], '--color must be one of: auto, yes, no (got "bogus")\n'),
        (["compose", "--project-name=p", "up", "svc"], 'required flag(s) "model" not set\n'),
        # a flag argparse cannot read: pflag's words (flag.go parseLongArg, and its Set errors wrapped as
        # `invalid argument %q for %q flag: %v`, here with strconv's tail) and docker/cli's FlagErrorFunc
        (
            ["configure", "--context-size"],
            "flag needs an argument: --context-size\n\nRun 'model configure --help' for more information\n",
        ),
        (
            ["configure", "--context-size", "abc", "m"],
            'invalid argument "abc" for "--context-size" flag: parsing "abc": invalid syntax\n\n'
            "Run 'model configure --help' for more information\n",
        ),
        (
            ["run", "m", "--color"],
            "flag needs an argument: --color\n\nUsage:  model run MODEL [PROMPT]\n\n"
            "Run 'model run --help' for more information\n",
        ),
    ],
)
def test_usage_errors_in_dmrs_words(tmp_path: Path, args: list[str], stderr: str) -> None:
    """Checked before the runner is asked (none answers here); DMR's main prints the error, exits 1."""
    result = run_cli(closed(tmp_path), *args)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", stderr)


def test_tag_checks_the_target_before_asking(tmp_path: Path) -> None:
    """tag.go: reference.NewTag(target) fails locally as `invalid tag: ...`; a digest is not a tag."""
    env = closed(tmp_path)
    spaced = run_cli(env, "tag", "ai/tiny", "Bad Ref")
    assert (spaced.returncode, spaced.stdout) == (1, "")
    assert spaced.stderr.startswith("invalid tag: ") and "Bad Ref" in spaced.stderr
    assert "cannot reach" not in spaced.stderr
    digest = "x@sha256:" + "0" * 64
    pinned = run_cli(env, "tag", "ai/tiny", digest)
    assert (pinned.returncode, pinned.stderr) == (1, f'invalid tag: reference "{digest}" is not a tag\n')


def test_package_stops_at_a_missing_file(tmp_path: Path) -> None:
    """package.go: the builder cannot open the GGUF: RunE's "Failed to package model", then the error; the
    step before it is printed, "Loading model to Model Runner..." is not."""
    missing = tmp_path / "absent.gguf"
    result = run_cli(closed(tmp_path), "package", "--gguf", str(missing), "ai/x")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f'Adding GGUF file from "{missing}"\n'
        "Failed to package model\n"
        f"package model: add gguf file: open {missing}: no such file or directory\n"
    )


# -- the daemon's refusals -----------------------------------------------------------------------------------


def test_configure_refuses_a_model_not_in_the_store(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """DMR's daemon keeps settings for any name (ConfigureRunner ignores GetLocal's error), so a typo went
    unseen; the CLI asks the store first. A stored model is configured as before."""
    env = cli_env(tmp_path, fake_daemon.url)
    refused = run_cli(env, "configure", "--context-size", "100", "ai/nope")
    assert (refused.returncode, refused.stdout) == (1, "")
    hint = "pull it first: model pull ai/nope"
    assert refused.stderr == f"Failed to configure ai/nope: model not found ({hint})\n"
    assert fake_daemon.http("GET", "/engines/_configure", params={"model": "ai/nope"}).json() == []
    accepted = run_cli(env, "configure", "--context-size", "100", "tiny")
    assert (accepted.returncode, accepted.stdout, accepted.stderr) == (0, "", "")


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    running = Registry(tmp_path / "registry").start()
    yield running
    running.stop()


def test_pull_and_runs_pull_fail_in_dmrs_words(
    fake_daemon: InProcessDaemon, tmp_path: Path, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """desktop.go Pull: a refused pull is `pulling X failed with status 404 Not Found: <body>`, after
    handleClientError's "Failed to pull model: "; run.go prints "Unable to find model ... locally" with
    cmd.Println (stdout under docker) and pulls with pullModel, so the same words end `run`."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-empty"))
    env = cli_env(tmp_path, fake_daemon.url)
    absent = f"{registry.host}/nowhere/m:v1"
    refused = fake_daemon.http("POST", "/models/create", json={"from": absent})
    assert refused.status_code == 404
    cause = refused.text.removesuffix("\n")  # http.Error's text
    pulled = run_cli(env, "pull", absent)
    assert (pulled.returncode, pulled.stdout) == (1, "")
    failure = f"Failed to pull model: pulling {absent} failed with status 404 Not Found: {cause}\n"
    assert pulled.stderr == failure
    ran = run_cli(env, "run", absent, "hi")
    assert ran.returncode == 1
    assert ran.stdout == f"Unable to find model '{absent}' locally. Pulling from the server.\n"
    assert ran.stderr == failure
    # compose.go's up: sendErrorf("Failed to pull model: %v", err), the same words as a message
    composed = run_cli(env, "compose", "--project-name=p", "up", f"--model={absent}", "svc")
    assert composed.returncode == 1
    last = json.loads(composed.stdout.splitlines()[-1])
    assert last == {"type": "error", "message": failure.removesuffix("\n")}


# -- an answer cut by its token limit --------------------------------------------------------------------


def test_an_answer_cut_by_its_limit_says_so_on_stderr(endpoint: OpenAIEndpoint, tmp_path: Path) -> None:
    """finish_reason "length": the answer is printed as it came, and stderr says it was cut (exit 0: the
    answer is what the model wrote); a finished answer says nothing."""
    endpoint.script = ["length", "ok"]
    env = cli_env(tmp_path)
    cut = run_cli(env, "run", "--openaiurl", endpoint.url, "m", "hi")
    assert (cut.returncode, cut.stdout) == (0, "first answer\n")
    assert 'finish_reason "length"' in cut.stderr and "cut short" in cut.stderr
    whole = run_cli(env, "run", "--openaiurl", endpoint.url, "m", "hi")
    assert (whole.returncode, whole.stdout, whole.stderr) == (0, "first answer\n", "")


def test_a_cut_answer_is_said_as_the_chats_last_line(endpoint: OpenAIEndpoint, tmp_path: Path) -> None:
    """In the interactive chat the notice follows the answer, before the next prompt; the cut answer stays
    in the conversation (the next turn sends it)."""
    endpoint.script = ["length"]
    with Terminal(
        ["run", "--openaiurl", endpoint.url, "m"], cli_env(tmp_path, TERM="xterm"), tmp_path
    ) as term:
        term.expect("> ")
        term.send("hello")
        shown = term.expect('finish_reason "length"')
        assert shown.rindex("first answer") < shown.rindex("cut short")
        term.expect("Send a message")  # the next prompt, after the notice
        term.send("more")
        term.expect("first answer")
        term.send("/bye")
        assert term.close() == 0
    assert endpoint.requests[1]["body"]["messages"][1] == {"role": "assistant", "content": "first answer"}


# -- another program on the runner's port ------------------------------------------------------------------


class _WebPage(http.server.BaseHTTPRequestHandler):
    def log_message(self, *_: object) -> None:
        pass

    def do_GET(self) -> None:
        page = b"<!DOCTYPE html><html><body><h1>404 Not Found</h1></body></html>"
        self.send_response(404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    do_POST = do_DELETE = do_GET


@pytest.fixture
def web_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _WebPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("args", [["ls"], ["inspect", "ai/x"], ["pull", "ai/x"], ["status"]])
def test_another_program_on_the_port_is_named_not_its_page(
    tmp_path: Path, web_server: str, args: list[str]
) -> None:
    result = run_cli(cli_env(tmp_path, f"http://{web_server}"), *args)
    assert result.returncode == 1
    assert f"something else answers on {web_server}" in result.stderr + result.stdout
    assert "<html>" not in result.stderr + result.stdout


# -- verbs that remove every model ask first ------------------------------------------------------------


QUESTION = "WARNING! This will remove the entire models directory.\nAre you sure you want to continue? [y/N] "


def test_uninstall_runner_models_asks_as_purge(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    env = cli_env(tmp_path, fake_daemon.url)
    declined = run_cli(env, "uninstall-runner", "--models", stdin="n\n")
    assert (declined.returncode, declined.stdout) == (0, QUESTION + "Operation cancelled.\n")
    assert fake_daemon.http("GET", "/models").json() != []
    ended = run_cli(env, "uninstall-runner", "--models")  # no answer (EOF): an error, nothing removed
    assert (ended.returncode, ended.stderr) == (1, "EOF\n")
    assert fake_daemon.http("GET", "/models").json() != []
    forced = run_cli(env, "uninstall-runner", "--models", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "Removed every model from the store" in forced.stdout and "WARNING" not in forced.stdout
    assert fake_daemon.http("GET", "/models").json() == []


# -- the interactive chat's hint ---------------------------------------------------------------------------


def test_the_chat_prompt_shows_dmrs_hint(endpoint: OpenAIEndpoint, tmp_path: Path) -> None:
    """run.go's readline.Prompt: Placeholder "Send a message (/? for help)" on an empty line,
    AltPlaceholder inside a multi-line message; both go at the first key."""
    with Terminal(
        ["run", "--openaiurl", endpoint.url, "m"], cli_env(tmp_path, TERM="xterm"), tmp_path
    ) as term:
        assert "Send a message (/? for help)" in term.expect("> ")
        term.send('"""')
        assert 'Use """ to end multi-line input' in term.expect('Use """ to end multi-line input')
        term.send('hello"""')
        term.expect("first answer")
        term.send("/bye")
        assert term.close() == 0
    assert [r["body"]["messages"] for r in endpoint.requests] == [[{"role": "user", "content": "hello"}]]


# -- piped stdin ----------------------------------------------------------------------------------------


def test_piped_stdin_is_trimmed_as_dmr_sends_it(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """run.go appends stdin as it is (the --debug line shows its last newline), then chatWithMarkdownContext
    sends processImagesInPrompt's strings.TrimSpace of it: the engine gets no trailing newline, in DMR too."""
    env = cli_env(tmp_path, fake_daemon.url)
    result = run_cli(env, "run", "--debug", "tiny", stdin="line one\nline two\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Running model tiny with prompt line one\nline two\n\n")
    [listing] = fake_daemon.http("GET", "/engines/requests", params={"model": "tiny"}).json()
    sent = json.loads(listing["records"][-1]["request"])
    assert sent["messages"] == [{"role": "user", "content": "line one\nline two"}]


# -- a typo in a model's name --------------------------------------------------------------------------


def test_a_failed_pull_of_a_name_close_to_a_stored_one_asks_if_that_was_meant(
    fake_daemon: InProcessDaemon, tmp_path: Path
) -> None:
    """Beyond DMR (issue 37 item 5): `registry.invalid` never resolves (RFC 6761), as every name offline:
    the registry could not be reached, said in words, not as the resolver's errno; a stored model whose
    name is close to the one asked for is offered, to `pull` and to `run`'s automatic pull."""
    fake_daemon.http("POST", "/models/tiny/tag?repo=registry.invalid/ai/tiny&tag=latest").raise_for_status()
    env = cli_env(tmp_path, fake_daemon.url)
    unreachable = "the registry registry.invalid could not be reached: its name could not be looked up"
    for args in (["pull", "registry.invalid/ai/tiyn"], ["run", "registry.invalid/ai/tiyn", "hi"]):
        result = run_cli(env, *args)
        assert result.returncode == 1
        first, second = result.stderr.splitlines()
        assert first.startswith(
            "Failed to pull model: pulling registry.invalid/ai/tiyn failed with status 502"
        )
        assert unreachable in first and "Errno" not in first
        assert second == "did you mean registry.invalid/ai/tiny? (it is in the local store)"
    far = run_cli(env, "pull", "registry.invalid/ai/other")
    assert far.returncode == 1 and len(far.stderr.splitlines()) == 1  # nothing close: no question
    # Docker Hub's models are offered as they are typed, `ai/` kept; another registry's are not offered
    daemon = Client(fake_daemon.url)
    assert [close_local_model(daemon, name) for name in ("ai/tiyn", "ai/zzzz", "other.invalid/ai/tiny")] == [
        "ai/tiny",
        None,
        None,
    ]
