"""`model skills`: install modelrunner's skill for AI coding assistants (DMR's `cmd/cli/commands/skills.go`).

The skill (skill_files/modelrunner/: SKILL.md and a reference) ships as package data and is copied into
the folder of each assistant asked for. As DMR: the targets in the order codex, claude, opencode, --dest;
an existing file is refused without --force. Unlike DMR, which checks each file as it writes, every target
is checked before anything is written, so a refusal leaves no half-installed skill behind.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from modelrunner.cli.common import DmrArgs, UsageError, takes

SKILL_PACKAGE = "modelrunner.cli"
SKILL_FOLDER = "skill_files"  # the package-data folder whose contents land in each target

# The assistants' own skill folders, under the home directory, in the order DMR installs them.
ASSISTANT_FOLDERS: dict[str, tuple[str, ...]] = {
    "codex": (".codex", "skills"),
    "claude": (".claude", "skills"),
    "opencode": (".config", "opencode", "skills"),
}


def skill_files() -> dict[str, bytes]:
    """The skill's files, by path relative to a target folder ("modelrunner/SKILL.md", ...)."""
    from importlib.resources import files
    from importlib.resources.abc import Traversable

    found: dict[str, bytes] = {}

    def walk(node: Traversable, prefix: str) -> None:
        for child in node.iterdir():
            name = f"{prefix}{child.name}"
            if child.is_dir():
                walk(child, name + "/")
            elif not child.name.startswith("."):
                found[name] = child.read_bytes()

    walk(files(SKILL_PACKAGE) / SKILL_FOLDER, "")
    return dict(sorted(found.items()))


def targets(args: argparse.Namespace, home: Path) -> list[Path]:
    """The folders to install into, from the flags (skills.go's runSkills)."""
    chosen = [home.joinpath(*folder) for name, folder in ASSISTANT_FOLDERS.items() if getattr(args, name)]
    if args.dest:
        chosen.append(Path(args.dest))
    if not chosen:
        raise UsageError("no target specified. Use --codex, --claude, --opencode, or --dest")
    return chosen


def check_target(target: Path, files: dict[str, bytes], force: bool) -> None:
    """skills.go's installSkills refusal: a file of the skill already there, unless `force`."""
    if force:
        return
    for relative in files:
        path = target / relative
        if path.exists() or path.is_symlink():
            raise UsageError(
                f"failed to install skills to {target}: "
                f"file already exists: {path} (use --force to overwrite)"
            )


def install(target: Path, files: dict[str, bytes]) -> None:
    """Write the skill's files under `target` (folders 0755, files 0644 as DMR), each atomically."""
    from modelrunner.fileio import write_file_atomic

    try:
        for relative, content in files.items():
            path = target / relative
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            write_file_atomic(path, content, 0o644)
    except OSError as exc:
        raise UsageError(f"failed to install skills to {target}: {exc.strerror or exc}") from exc


def cmd_skills(args: argparse.Namespace) -> None:
    chosen = targets(args, Path.home())
    files = skill_files()
    for target in chosen:
        check_target(target, files, args.force)
    for target in chosen:
        install(target, files)
        print(f"Installed modelrunner skills to {target}")


def add_commands(commands: Any) -> None:
    parser = commands.add_parser(
        "skills",
        help="Install modelrunner skills for AI coding assistants (Claude Code, Codex, OpenCode).",
        description="Install a skill that teaches AI coding assistants to use modelrunner for local "
        "inference: its commands, its API endpoints, and how to pick and configure a model. Targets: "
        "--codex ~/.codex/skills, --claude ~/.claude/skills, --opencode ~/.config/opencode/skills, "
        "--dest any folder.",
    )
    parser.add_argument(
        "--codex", action="store_true", help="Install skills for OpenAI Codex CLI (~/.codex/skills)"
    )
    parser.add_argument(
        "--claude", action="store_true", help="Install skills for Claude Code (~/.claude/skills)"
    )
    parser.add_argument(
        "--opencode", action="store_true", help="Install skills for OpenCode (~/.config/opencode/skills)"
    )
    parser.add_argument("--dest", metavar="DIR", default="", help="Install skills to a custom directory")
    parser.add_argument(
        "-f", "--force", action="store_true", help="Overwrite existing skills without prompting"
    )
    takes(parser, DmrArgs("skills", "", counted=False))  # no Args in skills.go: cobra takes any words
    parser.set_defaults(handler=cmd_skills)
