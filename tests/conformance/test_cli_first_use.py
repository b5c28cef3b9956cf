"""The first `model run` on a fresh runner home (issue 37 item 4): the engine the model needs is installed on
first use, with its progress, then the model runs, as DMR's CLI does.

Follows: docker/model-runner `cmd/cli/commands/install-runner.go` ensureStandaloneRunnerAvailable (called by
`run.go`'s newRunCmd before it runs a model; the install's progress through a StatusPrinter; the environment
variable MODEL_RUNNER_NO_AUTO_INSTALL turns it off).
"""

from __future__ import annotations

from pathlib import Path

from modelrunner.engines.base import EngineStatus, InstallState, ProgressCallback
from modelrunner.errors import EngineUnsupported
from tests.conformance.dmr_daemons import FakeDaemons, cli_env, run_cli
from tests.fake_engine import FakeEngine
from tests.terminal import Terminal

INSTALL_LINES = ["Using the cached build of llama.cpp (fake)", "Installed llama.cpp fake-1"]


class UninstalledEngine(FakeEngine):
    """The fake engine as a fresh runner home has it: not installed until an install is asked for; the
    install says what it does, as the real one does (the cached build)."""

    def __init__(self, installable: bool = True) -> None:
        super().__init__()
        self.installable = installable
        self.installs = 0

    def status(self) -> EngineStatus:
        if self.installs:
            return super().status()
        return EngineStatus(InstallState.NOT_INSTALLED, detail="no llama-server found")

    def prepare_install(self, gpu: str = "auto", version: str | None = None) -> None:
        if not self.installable:
            raise EngineUnsupported("llama.cpp cannot be installed: no compiler here")

    def install(self, progress: ProgressCallback, gpu: str = "auto", force: bool = False) -> EngineStatus:
        for line in INSTALL_LINES:
            progress(line)
        self.installs += 1
        return self.status()


def test_the_first_run_installs_the_engine_with_its_progress(
    fake_daemons: FakeDaemons, tmp_path: Path
) -> None:
    """Before: `llama.cpp is not installed; run: model install-runner --backend llama.cpp` and exit 1. Now
    the install's lines on stderr, then the answer on stdout; the next run installs nothing."""
    engine = UninstalledEngine()
    daemon = fake_daemons.start({}, engines={"llama.cpp": engine})
    env = cli_env(tmp_path, daemon.url)
    first = run_cli(env, "run", "tiny", "hi")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() != ""  # the fake engine's answer
    assert first.stderr.splitlines()[:3] == [
        "llama.cpp is not installed yet: installing it now (once; set MODEL_RUNNER_NO_AUTO_INSTALL=1 to "
        "turn this off)",
        *INSTALL_LINES,
    ]
    assert engine.installs == 1
    again = run_cli(env, "run", "tiny", "hi")
    assert (again.returncode, again.stderr, engine.installs) == (0, "", 1)


def test_detach_installs_too(fake_daemons: FakeDaemons, tmp_path: Path) -> None:
    """`run -d` (a load only) takes the same path as a one-shot run."""
    engine = UninstalledEngine()
    daemon = fake_daemons.start({}, engines={"llama.cpp": engine})
    loaded = run_cli(cli_env(tmp_path, daemon.url), "run", "-d", "tiny")
    assert (loaded.returncode, loaded.stdout) == (0, "")
    assert INSTALL_LINES[0] in loaded.stderr and engine.installs == 1
    assert [runner["backend_name"] for runner in daemon.ps()] == ["llama.cpp"]


def test_the_chat_installs_before_its_prompt(fake_daemons: FakeDaemons, tmp_path: Path) -> None:
    """The interactive chat's preload installed nothing: it said "background model preload failed" and
    every message then failed; now the install's lines come first, then the prompt, then answers."""
    engine = UninstalledEngine()
    daemon = fake_daemons.start({"FAKE_CHUNKS": "3"}, engines={"llama.cpp": engine})
    with Terminal(["run", "tiny"], cli_env(tmp_path, daemon.url, TERM="xterm"), tmp_path) as term:
        shown = term.expect("Send a message")
        assert INSTALL_LINES[1] in shown and "preload failed" not in shown
        term.send("hi")
        term.send("/bye")
        assert term.close() == 0
    assert engine.installs == 1
    assert [runner["backend_name"] for runner in daemon.ps()] == ["llama.cpp"]


def test_no_auto_install_keeps_the_daemons_refusal(fake_daemons: FakeDaemons, tmp_path: Path) -> None:
    """MODEL_RUNNER_NO_AUTO_INSTALL (DMR's switch) and an engine that cannot be installed here: the refusal
    is printed as before and nothing is installed."""
    engine = UninstalledEngine()
    daemon = fake_daemons.start({}, engines={"llama.cpp": engine})
    off = run_cli(cli_env(tmp_path, daemon.url, MODEL_RUNNER_NO_AUTO_INSTALL="1"), "run", "tiny", "hi")
    assert off.returncode == 1
    assert "llama.cpp is not installed" in off.stderr and "install-runner --backend llama.cpp" in off.stderr
    assert engine.installs == 0

    refusing = UninstalledEngine(installable=False)
    other = fake_daemons.start({}, engines={"llama.cpp": refusing}, home=tmp_path / "home2")
    failed = run_cli(cli_env(tmp_path, other.url), "run", "tiny", "hi")
    assert failed.returncode == 1
    assert "cannot be installed: no compiler here" in failed.stderr
    assert refusing.installs == 0


def test_image_flags_on_a_chat_model_are_said_to_be_ignored(
    fake_daemons: FakeDaemons, tmp_path: Path
) -> None:
    """Issue 37 item 10: `-o` on a chat model was dropped without a word; the answer is unchanged."""
    daemon = fake_daemons.start({"FAKE_CHUNKS": "3"})
    result = run_cli(cli_env(tmp_path, daemon.url), "run", "tiny", "hi", "-o", str(tmp_path / "x.png"))
    assert result.returncode == 0, result.stderr
    assert result.stderr == "-o/--output: only for image models; tiny answers in text, so it is ignored\n"
    assert not (tmp_path / "x.png").exists()


def test_a_slow_load_is_said_to_be_loading(fake_daemons: FakeDaemons, tmp_path: Path) -> None:
    """Issue 37 item 10 ("silent for minutes"): a model still loading after two seconds is said to be, on
    stderr (answer.py's loading_notice, which the image runs use too); the answer stays alone on stdout."""
    daemon = fake_daemons.start({"FAKE_START_DELAY": "4", "FAKE_CHUNKS": "3"})
    slow = run_cli(cli_env(tmp_path, daemon.url), "run", "tiny", "hi")
    assert slow.returncode == 0, slow.stderr
    assert slow.stderr == "Loading the model in llama.cpp...\n" and slow.stdout.strip() != ""
    loaded = run_cli(cli_env(tmp_path, daemon.url), "run", "tiny", "hi")
    assert (loaded.returncode, loaded.stderr) == (0, "")
