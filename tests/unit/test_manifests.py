"""`model generate`'s manifests as data: the YAML writer, what each option changes, and bad options.
(tests/integration/test_generate.py validates them against the Kubernetes schemas and a policy checker.)"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from modelrunner import manifests
from modelrunner.errors import BadRequest
from modelrunner.manifests import DeployOptions


def objects(**options: Any) -> dict[str, dict[str, Any]]:
    found = [doc for doc in yaml.safe_load_all(manifests.kube(DeployOptions(**options))) if doc]
    return {f"{doc['kind']}/{doc['metadata']['name']}": doc for doc in found}


def container(pod: dict[str, Any], name: str = "modelrunner") -> dict[str, Any]:
    [found] = [c for c in pod["containers"] if c["name"] == name]
    return dict(found)


@pytest.mark.parametrize(
    "value",
    [
        {
            "a": "yes",
            "b": "on",
            "c": "0.5",
            "d": "-ec",
            "e": "12434",
            "f": "x: y",
            "g": "",
            "h": "null",
            "i": "#x",
        },
        {"list": [1, "two", True, None, {"k": ["v", {}]}, []], "nested": {"x": {"y": {"z": "a'b\"c$"}}}},
        ["top", {"level": "list"}],
    ],
)
def test_the_yaml_writer_round_trips(value: Any) -> None:
    assert yaml.safe_load(manifests.to_yaml(value)) == value


def test_default_kube_manifests() -> None:
    found = objects()
    assert sorted(found) == ["NetworkPolicy/modelrunner", "Service/modelrunner", "StatefulSet/modelrunner"]
    stateful = found["StatefulSet/modelrunner"]
    assert {doc["metadata"]["namespace"] for doc in found.values()} == {"modelrunner"}
    pod = stateful["spec"]["template"]["spec"]
    daemon = container(pod)
    assert daemon["args"] == ["serve", "--host", "0.0.0.0", "--port", "12434"]
    key = daemon["env"][0]
    assert key["name"] == "MODEL_RUNNER_API_KEY"
    assert key["valueFrom"]["secretKeyRef"] == {"name": "modelrunner-api-key", "key": "api-key"}
    assert daemon["securityContext"]["readOnlyRootFilesystem"] is True
    assert daemon["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert daemon["resources"]["requests"]["memory"] == "4096Mi"  # no model to estimate from
    assert "/engines/status" in daemon["readinessProbe"]["exec"]["command"][-1]
    assert "initContainers" not in pod
    claim = stateful["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "100Gi"
    assert found["Service/modelrunner"]["spec"]["type"] == "ClusterIP"
    policy = found["NetworkPolicy/modelrunner"]["spec"]
    assert policy["ingress"] == [{"ports": [{"protocol": "TCP", "port": 12434}]}]


def test_options_reach_the_manifests() -> None:
    found = objects(
        replicas=3,
        gpu="amd",
        pre_pull=("ai/smollm2", "hf.co/org/m:Q4"),
        storage="1Ti",
        api_key_secret="my-key",
        node_port=31245,
        estimates={"ai/smollm2": 700 * manifests.MiB, "hf.co/org/m:Q4": 300 * manifests.MiB},
        cpus=4,
    )
    stateful = found["StatefulSet/modelrunner"]
    assert stateful["spec"]["replicas"] == 3
    pod = stateful["spec"]["template"]["spec"]
    daemon = container(pod)
    # the models' estimates plus the daemon's own share, and the scheduler's budget to match
    assert daemon["resources"]["limits"]["memory"] == f"{1000 + 512}Mi"
    budget = {e["name"]: e.get("value") for e in daemon["env"]}["MODEL_RUNNER_MEMORY_BUDGET"]
    assert int(budget) == 1000 * manifests.MiB
    assert daemon["resources"]["limits"]["amd.com/gpu"] == 1 and daemon["resources"]["limits"]["cpu"] == "4"
    assert daemon["image"].endswith("-vulkan")
    [pre_pull] = pod["initContainers"]
    assert pre_pull["command"][-2:] == ["ai/smollm2", "hf.co/org/m:Q4"]
    assert daemon["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "my-key"
    assert found["Service/modelrunner-nodeport"]["spec"]["ports"][0]["nodePort"] == 31245
    text = manifests.kube(DeployOptions(pre_pull=("ai/smollm2",), estimates={"ai/smollm2": manifests.GiB}))
    assert "# Memory estimate of ai/smollm2: 1024Mi." in text
    assert text.startswith("# model generate kube --pre-pull ai/smollm2\n")


def test_the_ray_cluster_option() -> None:
    found = objects(gpu="nvidia", ray_workers=2, memory_bytes=8 * manifests.GiB)
    assert sorted(found) == [
        "NetworkPolicy/modelrunner", "PersistentVolumeClaim/modelrunner-data", "RayCluster/modelrunner",
        "Service/modelrunner",
    ]  # fmt: skip
    cluster = found["RayCluster/modelrunner"]
    assert cluster["apiVersion"] == "ray.io/v1" and cluster["spec"]["rayVersion"] == "2.60.0"
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    assert [c["name"] for c in head["containers"]] == ["ray-head", "modelrunner"]  # Ray's container first
    env = {e["name"]: e.get("value") for e in container(head)["env"]}
    assert env["MODEL_RUNNER_RAY_ADDRESS"] == "127.0.0.1:6379"
    assert container(head, "ray-head")["resources"]["limits"]["nvidia.com/gpu"] == 1
    [group] = cluster["spec"]["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 2
    assert found["Service/modelrunner"]["spec"]["selector"] == {
        "ray.io/cluster": "modelrunner", "ray.io/node-type": "head",
    }  # fmt: skip


def test_compose() -> None:
    text = manifests.compose(
        DeployOptions(pre_pull=("ai/smollm2",), gpu="nvidia", memory_bytes=3 * manifests.GiB)
    )
    document = yaml.safe_load(text)
    service = document["services"]["modelrunner"]
    assert (
        service["read_only"] is True and service["user"] == "10001:10001" and service["cap_drop"] == ["ALL"]
    )
    assert service["environment"]["MODEL_RUNNER_API_KEY"].startswith("${MODEL_RUNNER_API_KEY:?")
    assert service["deploy"]["resources"]["limits"]["memory"] == "3072m"
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert service["depends_on"] == {"pre-pull": {"condition": "service_completed_successfully"}}
    # `$$`: Compose would otherwise read the shell's `$model` as one of its own variables
    assert '"$$model"' in document["services"]["pre-pull"]["entrypoint"][2]


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"name": "Bad_Name"}, "--name"),
        ({"namespace": "x" * 60}, "--namespace"),
        ({"replicas": 0}, "--replicas"),
        ({"gpu": "intel"}, "--gpu"),
        ({"storage": "100GB"}, "--storage"),
        ({"node_port": 80}, "--node-port"),
        ({"cpus": 0}, "--cpus"),
        ({"ray_workers": 2}, "--gpu nvidia"),
        ({"ray_workers": 2, "gpu": "nvidia", "replicas": 2}, "--replicas 1"),
        ({"pre_pull": ("ai/x; rm -rf /",)}, "--pre-pull"),
        ({"api_key_secret": "A"}, "--api-key-secret"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], why: str) -> None:
    with pytest.raises(BadRequest, match=why):
        manifests.kube(DeployOptions(**options))


def test_the_ray_option_is_for_kubernetes() -> None:
    with pytest.raises(BadRequest, match="KubeRay"):
        manifests.compose(DeployOptions(gpu="nvidia", ray_workers=1))
