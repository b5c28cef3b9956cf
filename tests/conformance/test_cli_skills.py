"""`model skills`: modelrunner's skill installed for Claude Code, Codex and OpenCode, in CLI processes whose
HOME is a temporary folder.

Follows: `cmd/cli/commands/skills.go` (newSkillsCmd: the flags; runSkills: the targets under the home
directory in the order codex, claude, opencode, --dest, the error when none is given, one "Installed ..."
line per target; installSkills: the embedded tree copied into each target, an existing file refused
without --force) and `cmd/cli/docs/reference/model_skills.md`. The skill itself is ours, so its text is
checked against our CLI: every `model <verb>` it names, and the flags it gives them, exist.
"""

from __future__ import annotations

import re
import stat
import tomllib
from pathlib import Path, PurePosixPath

import pytest

from modelrunner.cli import COMMAND_MODULES
from modelrunner.cli.skills import skill_files
from tests.conformance.dmr_daemons import cli_env, run_cli

SKILL = "modelrunner/SKILL.md"
GUIDE = "modelrunner/references/modelrunner-guide.md"
REPO = Path(__file__).parents[2]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    return folder


@pytest.fixture
def env(tmp_path: Path, home: Path) -> dict[str, str]:
    return cli_env(tmp_path, HOME=str(home))


def installed(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("flag", "folder"),
    [("--claude", ".claude/skills"), ("--codex", ".codex/skills"), ("--opencode", ".config/opencode/skills")],
)
def test_run_skills_installs_each_target_in_its_assistants_folder(
    env: dict[str, str], home: Path, flag: str, folder: str
) -> None:
    result = run_cli(env, "skills", flag)
    assert result.returncode == 0, result.stderr
    target = home / folder
    assert result.stdout == f"Installed modelrunner skills to {target}\n"
    assert installed(target) == skill_files()
    assert set(skill_files()) == {SKILL, GUIDE}
    for path in target.rglob("*"):  # installSkills: folders 0755, files 0644
        assert stat.S_IMODE(path.stat().st_mode) == (0o755 if path.is_dir() else 0o644)


def test_run_skills_installs_every_target_asked_in_dmrs_order(
    env: dict[str, str], home: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "custom" / "skills"
    result = run_cli(env, "skills", "--dest", str(dest), "--opencode", "--claude", "--codex")
    assert result.returncode == 0, result.stderr
    targets = [home / ".codex/skills", home / ".claude/skills", home / ".config/opencode/skills", dest]
    assert result.stdout.splitlines() == [f"Installed modelrunner skills to {t}" for t in targets]
    for target in targets:
        assert installed(target) == skill_files()


def test_run_skills_dest_installs_into_the_folder_given(
    env: dict[str, str], home: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "project" / ".agents"
    result = run_cli(env, "skills", "--dest", str(dest))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"Installed modelrunner skills to {dest}\n"
    assert installed(dest) == skill_files()
    assert not any(home.iterdir())  # the home is left alone


def test_run_skills_without_a_target_is_refused(env: dict[str, str], home: Path) -> None:
    result = run_cli(env, "skills")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == "no target specified. Use --codex, --claude, --opencode, or --dest\n"
    assert not any(home.iterdir())


def test_install_skills_refuses_an_existing_skill_without_force_and_writes_nothing(
    env: dict[str, str], home: Path
) -> None:
    claude = home / ".claude/skills"
    existing = claude / SKILL
    existing.parent.mkdir(parents=True)
    existing.write_text("the user's own skill\n")
    result = run_cli(env, "skills", "--codex", "--claude")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"failed to install skills to {claude}: file already exists: {existing} (use --force to overwrite)\n"
    )
    # every target is checked before any is written: nothing changed, not even the target before it
    assert existing.read_text() == "the user's own skill\n"
    assert installed(claude) == {SKILL: b"the user's own skill\n"}
    assert not (home / ".codex").exists()


def test_install_skills_refuses_an_existing_reference_file_too(env: dict[str, str], tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    (dest / GUIDE).parent.mkdir(parents=True)
    (dest / GUIDE).write_text("mine\n")
    result = run_cli(env, "skills", "--dest", str(dest))
    assert result.returncode == 1
    assert f"file already exists: {dest / GUIDE} (use --force to overwrite)" in result.stderr
    assert installed(dest) == {GUIDE: b"mine\n"}  # SKILL.md not written either


@pytest.mark.parametrize("force", ["--force", "-f"])
def test_install_skills_force_overwrites_an_existing_skill(
    env: dict[str, str], home: Path, force: str
) -> None:
    target = home / ".claude/skills"
    (target / SKILL).parent.mkdir(parents=True)
    (target / SKILL).write_text("old\n")
    (target / "someone-else/SKILL.md").parent.mkdir(parents=True)
    (target / "someone-else/SKILL.md").write_text("another skill\n")
    result = run_cli(env, "skills", "--claude", force)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"Installed modelrunner skills to {target}\n"
    assert installed(target) == {**skill_files(), "someone-else/SKILL.md": b"another skill\n"}


def test_run_skills_a_target_that_cannot_be_a_folder_is_a_clear_error(
    env: dict[str, str], tmp_path: Path
) -> None:
    dest = tmp_path / "a-file"
    dest.write_text("not a folder\n")
    result = run_cli(env, "skills", "--dest", str(dest))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith(f"failed to install skills to {dest}: ")
    assert "Traceback" not in result.stderr
    assert dest.read_text() == "not a folder\n"


def test_new_skills_cmd_flags_as_dmrs(env: dict[str, str]) -> None:
    """newSkillsCmd: cobra's legacyArgs takes stray words; an unknown flag is pflag's error."""
    usage = run_cli(env, "skills", "--help")
    assert usage.returncode == 0
    for flag in ("--codex", "--claude", "--opencode", "--dest DIR", "-f, --force"):
        assert flag in usage.stdout
    unknown = run_cli(env, "skills", "--cursor")
    assert unknown.returncode == 1
    assert unknown.stderr.startswith("unknown flag: --cursor\n\nUsage:  model skills")


def test_the_skill_declares_its_name_and_when_to_use_it() -> None:
    """SKILL.md's front matter: the name the assistants index it by (its folder's) and a description."""
    text = skill_files()[SKILL].decode()
    front, _, body = text.removeprefix("---\n").partition("\n---\n")
    fields = dict(line.split(": ", 1) for line in front.splitlines())
    assert fields["name"] == "modelrunner" == SKILL.split("/")[0]
    assert len(fields["description"]) > 80
    assert "references/modelrunner-guide.md" in body


def _commands(text: str) -> list[tuple[str, list[str]]]:
    """Each `model VERB ...` written in code (inline or fenced): the verb and the long flags it is given
    (before a `--`, after which flags are the engine's)."""
    code = re.findall(r"```.*?```|`[^`\n]+`", text, flags=re.S)
    found = []
    for block in code:
        for line in block.strip("`").splitlines():
            for match in re.finditer(r"(?<![\w./\"-])model ([a-z][a-z-]*)([^`#\n]*)", line):
                words = match.group(2).split(" -- ")[0]
                found.append((match.group(1), re.findall(r"(?<!\S)(--[a-z][a-z-]*)", words)))
    return found


@pytest.mark.parametrize("name", [SKILL, GUIDE])
def test_every_command_the_skill_teaches_exists_in_our_cli(env: dict[str, str], name: str) -> None:
    commands = _commands(skill_files()[name].decode())
    verbs = sorted({verb for verb, _ in commands})
    assert {"pull", "run", "ls", "ps", "configure", "unload"} <= set(verbs) or name == GUIDE
    helps = []
    for verb in verbs:
        assert any(verb in names for names in COMMAND_MODULES.values()), f"model {verb} does not exist"
        # an unknown verb would print the top-level help (`usage: model [-h] ...`) with exit 0
        usage = run_cli(env, verb, "--help")
        assert usage.returncode == 0 and re.match(r"usage: model [a-z]", usage.stdout), verb
        helps.append(usage.stdout)
        for flag in {flag for v, flags in commands if v == verb for flag in flags}:
            assert re.search(rf"(?<![\w-]){flag}\b", usage.stdout), f"model {verb} has no {flag}"
    # a flag written on its own (`--context-size N`) is one of the verbs' above
    for flag in re.findall(r"`(--[a-z][a-z-]*)", skill_files()[name].decode()):
        assert any(re.search(rf"(?<![\w-]){flag}\b", text) for text in helps), flag


def test_the_skill_files_are_package_data() -> None:
    """pyproject's package-data globs take every skill file into the wheel (setuptools globs: `*` stays in
    one path segment)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = [PurePosixPath(g) for g in pyproject["tool"]["setuptools"]["package-data"]["modelrunner"]]
    for relative in skill_files():
        path = PurePosixPath("cli/skill_files") / relative
        assert any(len(g.parts) == len(path.parts) and path.match(str(g)) for g in globs), path
