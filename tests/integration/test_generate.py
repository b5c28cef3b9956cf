"""`model generate`'s manifests against outside judges, offline: the Kubernetes schemas (kubernetes-validate,
strict: unknown fields are errors) and a static policy checker (checkov, in its own environment); the
examples under deploy/ are what the CLI prints; memory requests come from a real daemon's estimates."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from modelrunner import manifests
from modelrunner.manifests import DeployOptions
from tests.daemon import Daemon
from tests.models import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "deploy").glob("*/*.yaml"))
KUBE_VERSION = kubernetes_validate.latest_version()
CHECKOV = "checkov==3.3.30"
# What checkov flags in the examples, and why it stays so. Anything else it flags fails the test.
ACCEPTED = {
    "CKV_K8S_43": "images are built here (deploy/image/build): pin its digest when pushed (--image)",
    "CKV_K8S_35": "the daemon reads its API key from MODEL_RUNNER_API_KEY (DMR's way), as does the probe",
}
OPTION_MATRIX = [
    DeployOptions(),
    DeployOptions(replicas=3, gpu="nvidia", node_port=30001, pre_pull=("ai/smollm2", "ai/gemma3")),
    DeployOptions(gpu="amd", storage="10Gi", api_key_secret="other", name="mr", namespace="models", cpus=8),
    DeployOptions(gpu="nvidia", ray_workers=4, pre_pull=("ai/qwen3",), memory_bytes=64 * manifests.GiB),
]


def generate(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "modelrunner", "generate", *args], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def kube_documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def schema_checked(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects the Kubernetes schemas cover: the document, or for a KubeRay RayCluster (a custom resource,
    whose schema is not in kubernetes-validate) the pod templates of its head and worker groups."""
    if doc["kind"] != "RayCluster":
        return [doc]
    spec = doc["spec"]
    templates = [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]
    assert set(spec) == {"rayVersion", "headGroupSpec", "workerGroupSpecs"}
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        assert all(isinstance(v, str) for v in group["rayStartParams"].values())  # KubeRay: a string map
    return [
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"t{i}"}, "template": template}
        for i, template in enumerate(templates)
    ]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_examples_are_what_the_cli_prints(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# model generate "), "an example's first line is the command that makes it"
    args = shlex.split(first.removeprefix("# model generate "))
    assert generate(*args) == path.read_text(), f"regenerate it: {first[2:]} > {path.relative_to(ROOT)}"


@pytest.mark.parametrize("options", OPTION_MATRIX, ids=lambda o: o.command("kube")[20:] or "defaults")
def test_kube_manifests_pass_the_kubernetes_schemas(options: DeployOptions) -> None:
    documents = kube_documents(manifests.kube(options))
    for doc in documents:
        for checked in schema_checked(doc):
            assert kubernetes_validate.validate(checked, KUBE_VERSION, strict=True)
    # the schemas do refuse a mistake (a field of the wrong name), so their passing means something
    [pods] = [d for d in documents if d["kind"] in ("StatefulSet", "RayCluster")]
    wrong = json.loads(json.dumps(pods).replace('"readOnlyRootFilesystem"', '"readOnlyRootFileSystem"'))
    with pytest.raises(kubernetes_validate.ValidationError):
        for checked in schema_checked(wrong):
            kubernetes_validate.validate(checked, KUBE_VERSION, strict=True)


def test_the_example_compose_file_parses_as_compose() -> None:
    document = yaml.safe_load((ROOT / "deploy" / "compose" / "compose.yaml").read_text())
    assert set(document) == {"name", "services", "volumes"}
    for service in document["services"].values():
        assert service["read_only"] is True and service["user"] == "10001:10001"
    # published on the host's loopback only (issue 36 item 8: it was every interface)
    assert document["services"]["modelrunner"]["ports"] == ["127.0.0.1:12434:12434"]


@pytest.fixture(scope="module")
def checkov() -> Path:
    """checkov in its own environment under the machine cache (it pins many packages of its own)."""
    from modelrunner.engines.install import cached_or_made, engine_cache_root

    base = engine_cache_root("tools")
    folder = base / CHECKOV.replace("==", "-")
    python = folder / "bin" / "python"

    def make() -> Path:
        staging = base / f".{folder.name}.tmp"
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(staging)], check=True)
        subprocess.run([str(staging / "bin" / "python"), "-m", "pip", "install", "-q", CHECKOV], check=True)
        staging.rename(folder)  # `python -m checkov.main` works from the moved environment
        return python

    waiting = "waiting for checkov's environment"
    return cached_or_made(
        base, folder.name, waiting, print, lambda: python if python.exists() else None, make
    )


def test_kube_examples_pass_the_policy_checker(checkov: Path) -> None:
    result = subprocess.run(
        [
            str(checkov),
            "-m",
            "checkov.main",
            "-d",
            str(ROOT / "deploy" / "kube"),
            "--framework",
            "kubernetes",
            "--compact",
            "--quiet",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    report = json.loads(result.stdout)
    reports = report if isinstance(report, list) else [report]
    failed = [check for r in reports for check in r["results"]["failed_checks"]]
    passed = sum(r["summary"]["passed"] for r in reports)
    assert passed > 100 and sum(r["summary"]["parsing_errors"] for r in reports) == 0
    unexpected = [
        f"{c['check_id']} {c['check_name']} ({c['resource']})"
        for c in failed
        if c["check_id"] not in ACCEPTED
    ]
    assert not unexpected, "\n".join(unexpected)


@pytest.fixture
def daemon_with_a_model(daemon: Daemon, tmp_path: Path) -> Daemon:
    source = write_tiny_gguf(tmp_path / "tiny.gguf")
    daemon.cli("package", "--gguf", str(source), "--context-size", "512", "ai/tiny")
    return daemon


def test_memory_is_requested_from_the_daemons_estimate(daemon_with_a_model: Daemon) -> None:
    estimate = daemon_with_a_model.http("GET", "/engines/estimate", params={"model": "ai/tiny"}).json()
    assert estimate["backend"] == "llama.cpp" and estimate["memory_bytes"] > 0
    text = daemon_with_a_model.cli("generate", "kube", "--pre-pull", "ai/tiny").stdout
    [stateful] = [doc for doc in kube_documents(text) if doc["kind"] == "StatefulSet"]
    requested = stateful["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"]
    assert requested == manifests.mebibytes(estimate["memory_bytes"] + manifests.DAEMON_MEMORY)
    assert f"# Memory estimate of ai/tiny: {manifests.mebibytes(estimate['memory_bytes'])}." in text
    # a model that is not in the store cannot be estimated: say what to do, print nothing
    missing = daemon_with_a_model.cli("generate", "kube", "--pre-pull", "ai/absent", check=False)
    assert missing.returncode == 1 and not missing.stdout
    assert missing.stderr == (
        "Error: ai/absent is not in the local store, so its memory cannot be estimated: pull it first "
        "(model pull ai/absent), or give --memory (e.g. --memory 8GiB)\n"
    )
    assert (
        "--memory 4096MiB"
        in daemon_with_a_model.cli("generate", "kube", "--pre-pull", "ai/absent", "--memory", "4GiB").stdout
    )
    refused = daemon_with_a_model.cli("generate", "compose", "--replicas", "0", check=False)
    assert refused.returncode == 1 and "--replicas" in refused.stderr  # a usage error: exit 1, as DMR's
