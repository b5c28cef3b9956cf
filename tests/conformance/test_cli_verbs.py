"""`show`, `purge`, `bench`, `package`, `run` with stdin, `context rm` and the argument checks of the other
verbs, as DMR's CLI prints and exits (issue 20, items 3 and 10).

Follows: `cmd/cli/commands/show.go` (formatModelInfo), `purge.go` (newPurgeCmd, fmt.Scanln),
`pkg/inference/models/http_handler.go` (handlePurge), `bench.go` (printBenchmarkTable, the --json
document), `package.go` (packageModel's PrintErr steps, its Args), `run.go` (newRunCmd: prompt and stdin),
`context.go` (newContextRmCmd), `inspect.go`; spf13/pflag (no abbreviated flags) and docker/cli's
FlagErrorFunc.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from modelrunner.cli.bench import LevelResult, summary_text
from tests.conformance.dmr_daemons import cli_env, run_cli
from tests.conformance.openai_endpoint import OpenAIEndpoint
from tests.daemon import free_port
from tests.inprocess import InProcessDaemon
from tests.models import write_tiny_gguf


def test_show_is_format_model_info(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """show.go formatModelInfo: padded labels, the daemon's tags, RFC 3339 creation, blank lines."""
    env = {**cli_env(tmp_path, fake_daemon.url), "TZ": "UTC"}
    model = fake_daemon.http("GET", "/models/tiny").json()
    shown = run_cli(env, "show", "tiny")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.split("\n")
    assert lines[:3] == [f"Model:       {model['id']}", "Tags:        docker.io/ai/tiny:latest", lines[2]]
    assert lines[2].startswith("Created:     ") and lines[2].endswith("Z") and lines[3] == ""
    assert "Format:       gguf" in lines and "Architecture: llama" in lines
    metadata = lines.index("GGUF Metadata:")
    assert lines[metadata - 1] == "" and lines[metadata + 1].startswith("  ")
    assert shown.stdout.endswith("\n") and not shown.stdout.endswith("\n\n")


def test_purge_asks_on_any_stdin(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """purge.go: fmt.Scanln of stdin; only y/Y goes on; cancelled with 0; EOF is an error; nothing printed
    after the question on success; the route answers an empty 200 (handlePurge)."""
    env = cli_env(tmp_path, fake_daemon.url)
    question = (
        "WARNING! This will remove the entire models directory.\nAre you sure you want to continue? [y/N] "
    )
    for answer in ("n\n", "\n", "yes\n"):
        declined = run_cli(env, "purge", stdin=answer)
        assert (declined.returncode, declined.stdout) == (0, question + "Operation cancelled.\n")
    ended = run_cli(env, "purge", stdin="")
    assert (ended.returncode, ended.stdout, ended.stderr) == (1, question, "EOF\n")
    assert fake_daemon.http("GET", "/models").json() != []
    purged = run_cli(env, "purge", stdin="y\n")
    assert (purged.returncode, purged.stdout, purged.stderr) == (0, question, "")
    assert fake_daemon.http("GET", "/models").json() == []
    empty = fake_daemon.http("DELETE", "/models/purge")
    assert (empty.status_code, empty.content) == (200, b"")


def test_bench_table_and_json(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """bench.go printBenchmarkTable's text, and its --json document of BenchmarkResult structs."""
    one, two = LevelResult(1), LevelResult(2)
    one.token_counts, one.seconds = [10, 10], 2.0
    two.token_counts, two.seconds = [10, 10, 10], 2.0
    assert summary_text([one, two]) == (
        "\nBenchmark #1: Tokens per Second at Different Concurrency Levels\n\n"
        "Concurrency 1: 10.00 tokens/sec (rel. speed: 1.00x)\n"
        "Concurrency 2: 15.00 tokens/sec (rel. speed: 1.50x) fastest\n\n"
        "Summary:\n" + "-" * 50 + "\n"
        f"{'Metric':<25} {'Value':<20}\n" + "-" * 50 + "\n"
        f"{'Max Tokens/sec':<25} {'15.00':<20}\n"
        f"{'Best concurrency':<25} {'2':<20}\n"
        f"{'Improvement from 1':<25} {'50.0':<20}%\n" + "-" * 50 + "\n\n"
        "Detailed Results:\n" + "-" * 80 + "\n"
        f"{'Concurrency':<12} {'Tokens/sec':<15} {'Rel. Speed':<15} "
        f"{'Requests/sec':<15} {'Total Tokens':<15}\n" + "-" * 80 + "\n"
        f"{'1':<12} {'10.00':<15} {'1.00':<15} {'1.00':<15} {'20':<15}\n"
        f"{'2':<12} {'15.00':<15} {'1.50':<15} {'1.50':<15} {'30':<15}\n" + "-" * 80 + "\n"
    )
    env = cli_env(tmp_path, fake_daemon.url)
    ran = run_cli(env, "bench", "tiny", "--concurrency", "1", "--duration", "1s", "--json")
    assert ran.returncode == 0, ran.stderr
    document = json.loads(ran.stdout)
    assert list(document) == ["model", "prompt", "results"] and document["model"] == "tiny"
    [level] = document["results"]
    assert list(level) == [
        "Concurrency",
        "MeanRPS",
        "TotalTokens",
        "TPS",
        "TotalTime",
        "Requests",
        "TokenCounts",
    ]
    assert level["TotalTokens"] == sum(level["TokenCounts"]) and isinstance(level["TotalTime"], int)
    assert ran.stdout.startswith('{\n  "model": "tiny",\n')
    text = run_cli(env, "bench", "tiny", "--concurrency", "1", "--duration", "1s")
    assert text.stdout.startswith(
        "Prompt: Write a comprehensive 100 word summary on whales and their impact on society.\n"
        "Duration: 1s per concurrency level\nConcurrency levels: [1]\n\n"
        "Running benchmark with concurrency: 1\n  Tokens per second: "
    )


def test_package_steps_go_to_stderr(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """package.go: its steps on stderr (PrintErr), nothing on stdout; its Args' texts, exit 1."""
    env = cli_env(tmp_path, fake_daemon.url)
    gguf = write_tiny_gguf(tmp_path / "p.gguf", seed=4)
    done = run_cli(env, "package", "--gguf", str(gguf), "--context-size", "64", "p")
    assert (done.returncode, done.stdout) == (0, "")
    assert done.stderr == (
        f'Adding GGUF file from "{gguf}"\nSetting context size 64\n'
        "Loading model to Model Runner...\n\nModel loaded successfully\n"
    )
    variant = run_cli(env, "package", "--from", "p", "--context-size", "32", "p:small")
    assert (variant.returncode, variant.stdout) == (0, "")
    assert variant.stderr == (
        'Reading model from daemon: "p"\nSetting context size 32\n'
        "Creating lightweight model variant...\nModel variant created successfully\n"
    )
    none = run_cli(env, "package", "q")
    assert (none.returncode, none.stdout) == (1, "")
    assert none.stderr == (
        "One of --gguf, --safetensors-dir, --dduf, or --from is required.\n\n"
        "See 'docker model package --help' for more information\n"
    )
    two = run_cli(env, "package", "--gguf", str(gguf), "--from", "p", "q")
    assert two.returncode == 1 and two.stderr.startswith("Cannot specify more than one of --gguf")


def test_run_keeps_stdin_as_it_is(endpoint: OpenAIEndpoint, tmp_path: Path) -> None:
    """run.go: the prompt's words, "\\n\\n", then stdin's bytes (its CRLF and last newline kept, as the
    --debug line shows); a blank prompt is still a one-shot answer."""
    env = cli_env(tmp_path)
    command = [sys.executable, "-m", "modelrunner", "run", "--openaiurl", endpoint.url, "--debug", "m", "a"]
    result = subprocess.run(command, env=env, capture_output=True, input=b"b\r\nc\n", timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"Running model m with prompt a\n\nb\r\nc\n\nfirst answer\n"
    blank = subprocess.run(command[:-1], env=env, capture_output=True, input=b"\n", timeout=60)
    assert blank.returncode == 0, blank.stderr
    assert blank.stdout == b"Running model m with prompt \n\nfirst answer\n"
    assert len(endpoint.requests) == 2


def test_context_rm_texts(tmp_path: Path) -> None:
    """context.go newContextRmCmd: `Error: NAME: cause` per failure (Go's %q), then RunE's error as DMR's
    main prints it, exit 1."""
    env = cli_env(tmp_path)
    assert run_cli(env, "context", "create", "lab", "--host", "http://127.0.0.1:1").returncode == 0
    result = run_cli(env, "context", "rm", "absent", "lab")
    assert (result.returncode, result.stdout) == (1, 'Context "lab" removed.\n')
    assert result.stderr == (
        'Error: absent: context "absent" not found\none or more contexts could not be removed\n'
    )


@pytest.mark.parametrize(
    ("args", "problem", "usage"),
    [
        (["df", "--bogus"], "unknown flag: --bogus", "df"),
        (["purge", "-z"], "unknown shorthand flag: 'z' in -z", "purge [OPTIONS]"),
        (["ls", "--jso"], "unknown flag: --jso", "ls [OPTIONS] [MODEL]"),
        (["run", "--deb", "m"], "unknown flag: --deb", "run MODEL [PROMPT]"),
        (["package", "--gguf", "/x", "--conte", "9", "m"], "unknown flag: --conte", None),
        (["bench", "--concurr", "1", "m"], "unknown flag: --concurr", "bench MODEL"),
    ],
)
def test_unknown_and_abbreviated_flags(
    tmp_path: Path, args: list[str], problem: str, usage: str | None
) -> None:
    """pflag accepts no abbreviation of a long flag; docker/cli's FlagErrorFunc words the error, exit 1."""
    from modelrunner.cli.models import PACKAGE_USAGE

    result = run_cli(cli_env(tmp_path, f"http://127.0.0.1:{free_port()}"), *args)
    assert (result.returncode, result.stdout) == (1, "")
    path = f"model {args[0]}"
    line = f"model {usage}" if usage is not None else f"model package {PACKAGE_USAGE}"
    assert result.stderr == f"{problem}\n\nUsage:  {line}\n\nRun '{path} --help' for more information\n"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["ls", "a", "b"], "accepts at most 1 arg(s), received 2"),  # list.go: cobra.MaximumNArgs(1)
        (["context", "rm"], "requires at least 1 arg(s), only received 0"),  # context.go: MinimumNArgs(1)
        (["context", "inspect"], "requires at least 1 arg(s), only received 0"),
        (["context", "create"], "accepts 1 arg(s), received 0"),  # context.go: cobra.ExactArgs(1)
        (["context", "use", "a", "b"], "accepts 1 arg(s), received 2"),
    ],
)
def test_cobras_own_argument_counts(tmp_path: Path, args: list[str], error: str) -> None:
    """Verbs whose Args are cobra's own validators (args.go) fail with cobra's texts, as DMR's main prints
    them, exit 1, before anything is asked of the daemon or the context store."""
    result = run_cli(cli_env(tmp_path, f"http://127.0.0.1:{free_port()}"), *args)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", error + "\n")


def test_run_and_package_argument_counts(tmp_path: Path) -> None:
    """run.go requireMinArgs(1, "run", "MODEL [PROMPT]"), package.go requireExactArgs(1, ...)."""
    env = cli_env(tmp_path, f"http://127.0.0.1:{free_port()}")
    run = run_cli(env, "run")
    assert (run.returncode, run.stderr) == (
        1,
        "'model run' requires at least 1 argument(s).\n\nUsage:  model run MODEL [PROMPT]\n\n"
        "See 'model run --help' for more information\n",
    )
    package = run_cli(env, "package", "--gguf", "/x", "a", "b")
    assert package.returncode == 1 and package.stderr.startswith("'model package' requires 1 argument(s).")


def test_inspect_refuses_openai_with_short_remote(tmp_path: Path) -> None:
    """inspect.go: --openai with -r is refused before the runner is asked."""
    result = run_cli(cli_env(tmp_path, f"http://127.0.0.1:{free_port()}"), "inspect", "--openai", "-r", "m")
    assert (result.returncode, result.stderr) == (1, "--remote flag cannot be used with --openai flag\n")
