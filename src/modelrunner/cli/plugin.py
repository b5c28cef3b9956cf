"""`docker model ...`: modelrunner as a Docker CLI plugin (`docker-model`).

The Docker CLI finds `docker-model` in `<docker config dir>/cli-plugins/` (DOCKER_CONFIG, else
~/.docker), asks it `docker-model docker-cli-plugin-metadata` for a JSON description (SchemaVersion
"0.1.0" and a Vendor are required), and then runs it with its own command line: `docker [GLOBAL OPTIONS]
model ARGS...` becomes `docker-model [GLOBAL OPTIONS] model ARGS...`. The plugin drops docker's global
options (honouring `--config DIR`, where contexts live) and runs the `model` CLI on ARGS.

`Version` is the DMR CLI release whose interface this CLI follows: Docker Compose reads it (it passes a
model's runtime flags only to a plugin of version 1.0.6 or later).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from modelrunner import __version__

PLUGIN_NAME = "docker-model"
DMR_CLI_VERSION = "v1.2.6"  # docker/model-runner's CLI release that this CLI follows
METADATA = {
    "SchemaVersion": "0.1.0",
    "Vendor": "modelrunner",
    "Version": DMR_CLI_VERSION,
    "ShortDescription": f"Docker Model Runner (modelrunner {__version__})",
    "URL": "https://github.com/docker/model-runner",
}

# The docker CLI's global options that take a value; the others are flags (-D, --tls, --tlsverify).
_VALUED = {"--config", "-c", "--context", "-H", "--host", "-l", "--log-level"}
_VALUED |= {"--tlscacert", "--tlscert", "--tlskey"}


def plugin_arguments(argv: list[str]) -> list[str]:
    """The `model` CLI's arguments from the plugin's command line: docker's global options skipped up to
    the plugin's name, `--config DIR` applied as DOCKER_CONFIG."""
    words = list(argv)
    i = 0
    while i < len(words):
        word = words[i]
        if word == "model":
            return words[i + 1 :]
        if not word.startswith("-"):
            break  # no global options left: the plugin's name must come next
        name, has_value, value = word.partition("=")
        if name in _VALUED and not has_value:
            value = words[i + 1] if i + 1 < len(words) else ""
            i += 1
        if name == "--config" and value:
            os.environ["DOCKER_CONFIG"] = value
        i += 1
    return words[i:]


def main() -> None:
    argv = sys.argv[1:]
    if argv == ["docker-cli-plugin-metadata"]:
        print(json.dumps(METADATA, indent=4))
        return
    from modelrunner.cli import main as cli_main

    cli_main(plugin_arguments(argv), prog="docker model")


def plugin_folder() -> Path:
    from modelrunner.contexts import docker_config_dir

    return docker_config_dir() / "cli-plugins"


def plugin_executable() -> Path:
    """The `docker-model` script installed next to this Python's `model`."""
    found = Path(sys.executable).parent / PLUGIN_NAME
    if found.is_file():
        return found
    import shutil

    which = shutil.which(PLUGIN_NAME)
    if which is None:
        raise SystemExit(f"{PLUGIN_NAME} is not installed with modelrunner; reinstall it (scripts/setup)")
    return Path(which)


def install_plugin(force: bool) -> str:
    """Link `<docker config>/cli-plugins/docker-model` to our plugin; another plugin there (Docker's own
    Model Runner) is kept unless `force`."""
    source = plugin_executable().absolute()
    folder = plugin_folder()
    target = folder / PLUGIN_NAME
    if target.is_symlink() and Path(os.readlink(target)) == source:
        return f"docker model already runs modelrunner ({target})"
    if (target.exists() or target.is_symlink()) and not force:
        raise SystemExit(
            f"{target} is another docker model plugin (Docker Model Runner's?); "
            "run `model install-plugin --force` to replace it"
        )
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f".{PLUGIN_NAME}.{os.getpid()}"
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(source)
    temporary.replace(target)
    return f"docker model now runs modelrunner ({target} -> {source})"


def cmd_install_plugin(args: argparse.Namespace) -> None:
    message = install_plugin(args.force)
    if not args.quiet:
        print(message)


def add_commands(commands: Any) -> None:
    install = commands.add_parser(
        "install-plugin",
        help="Make `docker model ...` run this CLI (a Docker CLI plugin in <docker config>/cli-plugins).",
    )
    install.add_argument("--force", action="store_true", help="replace another docker-model plugin")
    install.add_argument("--quiet", action="store_true", help="print nothing when all went well")
    install.set_defaults(handler=cmd_install_plugin)
