"""How a model reference is shown to people: the short names of DMR's CLI tables, also the labels of the
daemon's metrics and its dashboard. Light on purpose: the CLI imports it on every `model ls`."""

from __future__ import annotations

from modelrunner import config

# DMR's CLI's own defaults (utils.go: defaultOrg, defaultTag), the ones reference.py adds to a bare name
DEFAULT_ORG = "ai"
DEFAULT_TAG = "latest"


def display_name(full: str) -> str:
    """Short form for CLI tables, as DMR's `stripDefaultsFromModelName` (cmd/cli/commands/utils.go):
    the default registry's host (`docker.io/` or `index.docker.io/`, or DEFAULT_REGISTRY's when that is
    another registry), then `ai/`, then `:latest` are cut: `docker.io/ai/smollm2:latest` -> `smollm2`,
    `docker.io/myorg/m:latest` -> `myorg/m`, `huggingface.co/org/m:Q4_K_M` stays as it is. (Not in
    reference.py, so that `model ls` does not import the parser and its dataclass.)"""
    default = config.default_registry()
    hosts = ["index.docker.io/", "docker.io/"]
    if default not in ("index.docker.io", "docker.io"):
        hosts = [default if default.endswith("/") else default + "/"]
    for host in hosts:
        if full.startswith(host):
            full = full[len(host) :]
            break
    return full.removeprefix(f"{DEFAULT_ORG}/").removesuffix(f":{DEFAULT_TAG}")
