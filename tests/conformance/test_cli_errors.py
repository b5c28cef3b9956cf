"""The `model` CLI's usage errors and failures as DMR's CLI words them: its own argument checks, cobra's and
docker/cli's texts for what it does not check itself, the verbs' handleClientError messages, all on stderr
with exit code 1 (cmd/cli/main.go prints the error as it is and exits 1); and the JSON that inspect and
ls print as DMR re-encodes it.

Follows: `cmd/cli/commands/utils.go` (requireExactArgs, requireMinArgs, handleClientError), `inspect.go`,
`show.go`, `rm.go`, `tag.go`, `pull.go`, `list.go`, `formatter/json.go`, `cmd/cli/desktop/desktop.go`
(Inspect, InspectOpenAI, Remove, Tag), `pkg/inference/models/api.go` (OpenAIModel, DMRMetadata);
docker/cli `cli/cobra.go` (FlagErrorFunc) and `cli-plugins/plugin/plugin.go`; spf13/cobra `args.go`
(legacyArgs) and spf13/pflag's unknown-flag texts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conformance.dmr_daemons import cli_env, run_cli
from tests.daemon import free_port
from tests.docker_cli import docker, plugin_env
from tests.inprocess import InProcessDaemon


def _count_error(path: str, wanted: str, usage: str) -> str:
    """utils.go requireExactArgs / requireMinArgs, with the command path as invoked."""
    return (
        f"'{path}' requires {wanted} argument(s).\n\n"
        f"Usage:  {path} {usage}\n\n"
        f"See '{path} --help' for more information\n"
    )


@pytest.mark.parametrize(
    ("args", "wanted", "usage"),
    [
        (["inspect"], "1", "MODEL"),
        (["inspect", "a", "b"], "1", "MODEL"),
        (["show"], "1", "MODEL"),
        (["pull"], "1", "MODEL"),
        (["push", "a", "b"], "1", "MODEL"),
        (["bench"], "1", "MODEL"),
        (["tag", "a"], "2", "SOURCE TARGET"),
        (["tag", "a", "b", "c"], "2", "SOURCE TARGET"),
        (["rm"], "at least 1", "[MODEL...]"),
        (["rm", "-f"], "at least 1", "[MODEL...]"),
    ],
)
def test_argument_counts(tmp_path: Path, args: list[str], wanted: str, usage: str) -> None:
    """utils.go requireExactArgs / requireMinArgs: checked before the runner is reached (none answers)."""
    result = run_cli(cli_env(tmp_path, f"http://127.0.0.1:{free_port()}"), *args)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == _count_error(f"model {args[0]}", wanted, usage)


@pytest.mark.parametrize(
    ("args", "problem", "usage"),
    [
        (["inspect", "--bogus", "m"], "unknown flag: --bogus", "inspect MODEL"),
        (["rm", "--bogus=1", "m"], "unknown flag: --bogus", "rm [MODEL...]"),
        (["tag", "-z", "a", "b"], "unknown shorthand flag: 'z' in -z", "tag SOURCE TARGET"),
    ],
)
def test_unknown_flags(tmp_path: Path, args: list[str], problem: str, usage: str) -> None:
    """docker/cli cli/cobra.go FlagErrorFunc over pflag's error, before the argument count; DMR's main
    exits 1 whatever the StatusError's code."""
    result = run_cli(cli_env(tmp_path, f"http://127.0.0.1:{free_port()}"), *args, "extra", "words")
    assert (result.returncode, result.stdout) == (1, "")
    path = f"model {args[0]}"
    assert result.stderr == (
        f"{problem}\n\nUsage:  model {usage}\n\nRun '{path} --help' for more information\n"
    )


def test_usage_errors_through_docker(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """The same texts through the real Docker CLI and the plugin, with DMR's command path `docker model`."""
    env = plugin_env(tmp_path, fake_daemon.url)
    missing = docker(env, "model", "inspect")
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr == (
        "'docker model inspect' requires 1 argument(s).\n\n"
        "Usage:  docker model inspect MODEL\n\n"
        "See 'docker model inspect --help' for more information\n"
    )
    flag = docker(env, "model", "tag", "--bogus", "a", "b")
    assert (flag.returncode, flag.stdout) == (1, "")
    assert flag.stderr == (
        "unknown flag: --bogus\n\nUsage:  docker model tag SOURCE TARGET\n\n"
        "Run 'docker model tag --help' for more information\n"
    )
    absent = docker(env, "model", "inspect", "ai/absent")
    assert (absent.returncode, absent.stdout) == (1, "")
    assert absent.stderr == "Failed to get model ai/absent: ai/absent: model not found\n"


def test_failures_of_inspect_show_rm_and_tag(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """handleClientError(err, message) over desktop.go's errors: Inspect's errors.Wrap(ErrNotFound,
    model), Remove's `no such model` (after the lines of the models removed before it), Tag's
    `tagging failed with status ...`."""
    env = cli_env(tmp_path, fake_daemon.url)
    for verb in ("inspect", "show"):
        absent = run_cli(env, verb, "absent")
        assert (absent.returncode, absent.stdout) == (1, "")
        assert absent.stderr == "Failed to get model absent: absent: model not found\n"
    refused = fake_daemon.http("POST", "/models/absent/tag", params={"repo": "ai/x", "tag": "latest"})
    assert refused.status_code == 404
    tag = run_cli(env, "tag", "absent", "x")
    assert (tag.returncode, tag.stdout) == (1, "")
    cause = refused.text.removesuffix("\n")  # http.Error's text
    assert tag.stderr == f"failed to tag model: tagging failed with status 404 Not Found: {cause}\n"
    model_id = fake_daemon.http("GET", "/models/tiny").json()["id"]
    removed = run_cli(env, "rm", "tiny", "absent", "other")
    assert removed.returncode == 1
    assert removed.stdout == f"Untagged: docker.io/ai/tiny:latest\nDeleted: {model_id}\n"
    assert removed.stderr == "Failed to remove model: no such model: absent\n"


def test_rm_prints_the_tags_as_the_daemon_answers(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """desktop.go Remove: `Untagged: %s` of the daemon's DeleteModelResponse, not a shortened name."""
    env = cli_env(tmp_path, fake_daemon.url)
    assert run_cli(env, "tag", "tiny", "ai/m:v2").returncode == 0
    removed = run_cli(env, "rm", "m:v2")
    assert (removed.returncode, removed.stdout, removed.stderr) == (0, "Untagged: docker.io/ai/m:v2\n", "")


def test_pull_failure(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """pull.go: handleClientError(err, "Failed to pull model")."""
    result = run_cli(cli_env(tmp_path, fake_daemon.url), "pull", f"127.0.0.1:{free_port()}/nowhere/m:v1")
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith("Failed to pull model: ")


def test_inspect_json(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """inspect.go: formatter.ToStandardJSON (four spaces, HTML left as it is, a newline) of the model, or
    with --openai of the daemon's OpenAI model (InspectOpenAI: the same `id`, the `dmr` block without its
    empty fields, as the OpenAIModel struct re-encodes it)."""
    env = cli_env(tmp_path, fake_daemon.url)
    model = fake_daemon.http("GET", "/models/tiny").json()
    inspected = run_cli(env, "inspect", "tiny")
    assert inspected.returncode == 0, inspected.stderr
    assert inspected.stdout == json.dumps(model, indent=4, ensure_ascii=False) + "\n"
    assert inspected.stdout.startswith('{\n    "id": "sha256:')
    served = fake_daemon.http("GET", "/engines/v1/models/tiny").json()
    dmr = {k: v for k, v in served["dmr"].items() if v not in (None, "")}
    openai = run_cli(env, "inspect", "--openai", "tiny")
    assert openai.returncode == 0, openai.stderr
    assert openai.stdout == json.dumps({**served, "dmr": dmr}, indent=4) + "\n"
    assert json.loads(openai.stdout)["id"] == served["id"] and dmr["architecture"]
    both = run_cli(env, "inspect", "--openai", "--remote", "tiny")
    assert (both.returncode, both.stderr) == (1, "--remote flag cannot be used with --openai flag\n")


def test_ls_openai_omits_a_null_context_window_and_json_without_match_is_null(
    fake_daemon: InProcessDaemon, tmp_path: Path
) -> None:
    """list.go: ToStandardJSON of the OpenAIModelList (DMRMetadata's `omitempty`), and of a nil slice of
    models when the filter matched none (`null`)."""
    from modelrunner.cli.dmrformat import openai_model_view

    env = cli_env(tmp_path, fake_daemon.url)
    served = fake_daemon.http("GET", "/engines/v1/models").json()
    assert json.loads(run_cli(env, "ls", "--openai").stdout) == {
        **served,
        "data": [openai_model_view(m) for m in served["data"]],
    }
    # the daemon's null for a model without a context size; a nil *int32 with omitempty in DMR's struct
    plain = {"id": "ai/x", "object": "model", "created": 1, "owned_by": "docker"}
    unsized = {"context_window": None, "architecture": "llama", "parameters": "", "size": "1MB"}
    assert openai_model_view({**plain, "dmr": unsized}) == {
        **plain,
        "dmr": {"architecture": "llama", "size": "1MB"},
    }
    assert openai_model_view({**plain, "dmr": {"context_window": 0}}) == {
        **plain,
        "dmr": {"context_window": 0},
    }
    assert openai_model_view({**plain, "dmr": {"context_window": None}}) == plain
    none = run_cli(env, "ls", "--json", "absent")
    assert (none.returncode, none.stdout) == (0, "null\n")
    assert json.loads(run_cli(env, "ls", "--json").stdout)[0]["tags"] == ["docker.io/ai/tiny:latest"]
