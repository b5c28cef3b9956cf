"""Challenges, Docker credentials (config.json and credential helpers) and the address policy."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest

from modelrunner.distribution import netpolicy
from modelrunner.distribution.challenge import parse_challenge
from modelrunner.distribution.credentials import Credentials, find_credentials
from modelrunner.distribution.errors import UnsafeRedirect
from modelrunner.distribution.hf_select import quantization_of, select_files
from modelrunner.errors import ModelNotFound


def test_parse_bearer_challenge() -> None:
    challenge = parse_challenge(
        'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
        'scope="repository:ai/smollm2:pull",error="insufficient_scope"'
    )
    assert challenge is not None and challenge.scheme == "bearer"
    assert challenge.realm == "https://auth.docker.io/token"
    assert challenge.params["scope"] == "repository:ai/smollm2:pull"
    assert challenge.insufficient_scope


def test_parse_basic_and_unknown_challenges() -> None:
    basic = parse_challenge('Basic realm="registry"')
    assert basic is not None and basic.scheme == "basic" and basic.realm == "registry"
    assert parse_challenge("Negotiate abc") is None
    assert parse_challenge("") is None and parse_challenge(None) is None


@pytest.fixture
def docker_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    return tmp_path


def write_config(folder: Path, doc: object) -> None:
    (folder / "config.json").write_text(json.dumps(doc))


def test_inline_auths_match_hosts_and_docker_hub_urls(docker_dir: Path) -> None:
    token = base64.b64encode(b"bob:s3cret:with:colons").decode()
    write_config(
        docker_dir,
        {
            "auths": {
                "https://index.docker.io/v1/": {"auth": token},
                "registry.example:5000": {"username": "u", "password": "p"},
            }
        },
    )
    assert find_credentials("index.docker.io") == Credentials("bob", "s3cret:with:colons")
    assert find_credentials("registry.example:5000") == Credentials("u", "p")
    assert find_credentials("other.example") is None
    assert "s3cret" not in repr(find_credentials("index.docker.io"))


def test_missing_or_broken_config_means_anonymous(docker_dir: Path) -> None:
    assert find_credentials("index.docker.io") is None
    (docker_dir / "config.json").write_text("{broken")
    assert find_credentials("index.docker.io") is None


def install_helper(folder: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A docker-credential-<name> that answers for registry.example only and logs its stdin."""
    script = folder / f"docker-credential-{name}"
    script.write_text(
        "#!/bin/sh\n"
        f'read server; echo "$server" >> "{folder}/asked"\n'
        'if [ "$1" = get ] && [ "$server" = registry.example ]; then\n'
        '  echo \'{"ServerURL":"registry.example","Username":"helper-user","Secret":"helper-secret"}\'\n'
        "else echo 'credentials not found in native keychain'; exit 1; fi\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return script


def test_cred_helpers_and_creds_store(docker_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_helper(docker_dir, "fake", monkeypatch)
    write_config(docker_dir, {"credHelpers": {"registry.example": "fake"}})
    assert find_credentials("registry.example") == Credentials("helper-user", "helper-secret")
    write_config(
        docker_dir, {"credsStore": "fake", "auths": {"other.example": {"username": "a", "password": "b"}}}
    )
    assert find_credentials("registry.example") == Credentials("helper-user", "helper-secret")
    assert find_credentials("other.example") == Credentials("a", "b")  # helper has none: inline entry
    assert (docker_dir / "asked").read_text().splitlines() == [
        "registry.example",
        "registry.example",
        "other.example",
    ]


def test_helper_names_cannot_escape(docker_dir: Path) -> None:
    write_config(docker_dir, {"credsStore": "../../bin/sh"})
    assert find_credentials("registry.example") is None


def test_insecure_registry_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INSECURE_REGISTRY", raising=False)
    assert netpolicy.insecure_allowed("127.0.0.1:5000")
    assert netpolicy.insecure_allowed("localhost:5000")
    assert not netpolicy.insecure_allowed("registry.example:5000")
    monkeypatch.setenv("INSECURE_REGISTRY", "registry.example:5000, other.example")
    assert netpolicy.insecure_allowed("registry.example:5000")
    assert netpolicy.insecure_allowed("other.example")
    monkeypatch.setenv("INSECURE_REGISTRY", "true")
    assert netpolicy.insecure_allowed("anything.example")


@pytest.mark.parametrize(
    "target",
    [
        "http://169.254.169.254/latest/meta-data",
        "https://10.0.0.5/blob",
        "https://192.168.1.1/blob",
        "https://[::1]/blob",
        "https://[fe80::1]/blob",
        "https://127.0.0.1/blob",
        "file:///etc/passwd",
    ],
)
def test_public_registry_may_not_redirect_inwards(target: str) -> None:
    with pytest.raises(UnsafeRedirect):
        netpolicy.check_target(target, "8.8.8.8", "redirect")


def test_loopback_registry_may_redirect_to_loopback_only() -> None:
    netpolicy.check_target("http://127.0.0.1:9000/blob", "127.0.0.1:5000", "redirect")
    netpolicy.check_target("https://8.8.4.4/blob", "127.0.0.1:5000", "redirect")
    with pytest.raises(UnsafeRedirect):
        netpolicy.check_target("http://169.254.169.254/", "127.0.0.1:5000", "redirect")


def test_https_registry_may_not_downgrade(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INSECURE_REGISTRY", raising=False)
    with pytest.raises(UnsafeRedirect, match="plain HTTP"):
        netpolicy.check_target("http://8.8.4.4/blob", "8.8.8.8", "redirect")


# --- Hugging Face file selection ---------------------------------------------------------------------------


def test_quantization_names_from_paths() -> None:
    assert quantization_of("SmolLM2-135M-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert quantization_of("Q8_0/model-Q8_0-00001-of-00002.gguf") == "Q8_0"
    assert quantization_of("model.IQ2_XXS.gguf") == "IQ2_XXS"
    assert quantization_of("model-f16.gguf") == "F16"
    assert quantization_of("model.gguf") is None


def test_selection_rules() -> None:
    paths = ["a-Q8_0.gguf", "a-Q4_K_M.gguf", "mmproj-a-f32.gguf", "mmproj-a-f16.gguf", "chat_template.jinja"]
    chosen = select_files(paths, None, "org/a")
    assert chosen.files == ["a-Q4_K_M.gguf"] and chosen.default_used
    assert chosen.mmproj == "mmproj-a-f16.gguf" and chosen.chat_template == "chat_template.jinja"
    assert select_files(paths, "q8_0", "org/a").files == ["a-Q8_0.gguf"]
    # No default quantization: the alphabetically first model file, with all its shards.
    shards = ["b-F16-00002-of-00002.gguf", "b-F16-00001-of-00002.gguf", "c-Q8_0.gguf"]
    assert select_files(shards, None, "org/b").files == [
        "b-F16-00001-of-00002.gguf",
        "b-F16-00002-of-00002.gguf",
    ]
    with pytest.raises(ModelNotFound, match=r"no Q5_K_M in hf\.co/org/a; this repository has Q4_K_M, Q8_0"):
        select_files(paths, "Q5_K_M", "org/a")


def test_safetensors_selection_skips_other_frameworks() -> None:
    chosen = select_files(
        ["model.safetensors", "config.json", "pytorch_model.bin", ".gitattributes"], None, "o/m"
    )
    assert chosen.kind == "safetensors" and chosen.files == ["config.json", "model.safetensors"]
    with pytest.raises(ModelNotFound, match="no GGUF or safetensors"):
        select_files(["README.md"], None, "o/m")
