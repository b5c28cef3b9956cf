"""Deployment manifests of the daemon: Kubernetes (`model generate kube`), Compose (`model generate compose`).

The idea of RamaLama's `--generate`, with the options of DMR's Helm chart (charts/docker-model-runner/:
replicas, GPU resources, a persistent store, a model pre-pull step, probes on /engines/status, a Service and
a NodePort), and what DMR's chart leaves out: the daemon listens beyond loopback only with its API key, read
from a Secret; it runs as a non-root user on a read-only root file system; memory is requested from the
estimate of the pre-pulled models, and the scheduler's budget (MODEL_RUNNER_MEMORY_BUDGET) is set to match.
`ray_workers` adds a KubeRay `RayCluster` for vLLM across nodes (engines/ray_cluster.py).

Pure functions from options to text, so the examples under deploy/ are exactly what the CLI prints.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

from modelrunner import __version__
from modelrunner.errors import BadRequest

PORT = 12434
MiB = 1024 * 1024
GiB = 1024 * MiB
# The daemon itself (Python, the relay, the store): what a pod needs beyond its engines.
DAEMON_MEMORY = 512 * MiB
DEFAULT_MEMORY = 4 * GiB  # with no model to estimate from
UID = 10001  # the image's user (deploy/image/Containerfile)
RAY_GCS_PORT = 6379
GPU_RESOURCES = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}
IMAGE_VARIANTS = {None: "cpu", "nvidia": "cuda", "amd": "vulkan"}
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?")
_SIZE = re.compile(r"[1-9][0-9]{0,6}(Mi|Gi|Ti)")


def compose_confinement() -> dict[str, object]:
    """What every Compose container of the model runner gets: its store volume, a read-only root, no
    privileges (new lists each time: a YAML writer would show shared ones as anchors)."""
    return {
        "volumes": ["modelrunner-data:/data"],
        "read_only": True,
        "tmpfs": ["/tmp"],
        "user": f"{UID}:{UID}",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
    }


# The probe: /engines/status with the API key, from inside the container (kubelet's httpGet cannot read a
# Secret into a header, and the key is required on every route but `/`).
PROBE = (
    "import os, urllib.request as r; r.urlopen(r.Request('http://127.0.0.1:12434/engines/status', "
    "headers={'Authorization': 'Bearer ' + os.environ['MODEL_RUNNER_API_KEY']}), timeout=5)"
)
# Pulls the models with a daemon of its own on loopback (no key needed there), then stops it.
PRE_PULL = 'for model in "$@"; do model pull "$model"; done; model stop-runner'


@dataclass(frozen=True)
class DeployOptions:
    name: str = "modelrunner"
    namespace: str = "modelrunner"
    image: str | None = None  # None: the image deploy/image/build makes for the variant
    replicas: int = 1
    gpu: str | None = None  # "nvidia" | "amd"
    pre_pull: tuple[str, ...] = ()
    storage: str = "100Gi"
    api_key_secret: str = "modelrunner-api-key"
    node_port: int | None = None
    memory_bytes: int | None = None  # None: the models' estimates + the daemon, or DEFAULT_MEMORY
    cpus: int = 2
    ray_workers: int = 0  # > 0: a KubeRay RayCluster with this many GPU worker pods (vLLM on Ray)
    estimates: dict[str, int] = field(default_factory=dict)  # model -> bytes, from the daemon

    def validate(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise BadRequest("--name must be a DNS label: lowercase letters, digits and '-', at most 52")
        if not _NAME.fullmatch(self.namespace):
            raise BadRequest("--namespace must be a DNS label: lowercase letters, digits and '-', at most 52")
        if not _NAME.fullmatch(self.api_key_secret):
            raise BadRequest("--api-key-secret must name a Secret: lowercase letters, digits and '-'")
        if not 1 <= self.replicas <= 100:
            raise BadRequest("--replicas must be from 1 to 100")
        if self.gpu not in (None, *GPU_RESOURCES):
            raise BadRequest("--gpu must be nvidia or amd")
        if not _SIZE.fullmatch(self.storage):
            raise BadRequest("--storage must be a size such as 100Gi, 500Mi or 1Ti")
        if self.node_port is not None and not 30000 <= self.node_port <= 32767:
            raise BadRequest("--node-port must be in Kubernetes' NodePort range, 30000-32767")
        if not 1 <= self.cpus <= 512:
            raise BadRequest("--cpus must be from 1 to 512")
        if self.ray_workers and self.gpu != "nvidia":
            raise BadRequest(
                "the Ray cluster is for vLLM on GPUs: give --gpu nvidia (vLLM's Ray executor needs GPUs)"
            )
        if self.ray_workers and self.replicas != 1:
            raise BadRequest("with --ray-workers the model runner runs on the Ray head: keep --replicas 1")
        if not 0 <= self.ray_workers <= 64:
            raise BadRequest("--ray-workers must be from 0 to 64")
        for model in self.pre_pull:
            if not model or any(c.isspace() or c in "\"'`$\\;" for c in model):
                raise BadRequest(f"--pre-pull {model[:80]!r} is not a model reference")

    def command(self, target: str) -> str:
        """The `model generate` command line that prints these manifests (in the header, so that an
        example says how it was made and a test can make it again)."""
        words = ["model", "generate", target]
        defaults = DeployOptions()
        for name, flag in (
            ("name", "--name"),
            ("namespace", "--namespace"),
            ("image", "--image"),
            ("replicas", "--replicas"),
            ("gpu", "--gpu"),
            ("storage", "--storage"),
            ("api_key_secret", "--api-key-secret"),
            ("node_port", "--node-port"),
            ("cpus", "--cpus"),
            ("ray_workers", "--ray-workers"),
        ):
            value = getattr(self, name)
            if value != getattr(defaults, name):
                words += [flag, str(value)]
        if self.memory_bytes is not None:
            words += ["--memory", mebibytes(self.memory_bytes).replace("Mi", "MiB")]
        if self.pre_pull:
            words += ["--pre-pull", *self.pre_pull]
        return " ".join(words)

    @property
    def image_ref(self) -> str:
        variant = IMAGE_VARIANTS[self.gpu] + ("-vllm" if self.ray_workers else "")
        return self.image or f"localhost/modelrunner:{__version__}-{variant}"

    @property
    def memory(self) -> int:
        """What the daemon's container requests: the explicit size, else the pre-pulled models' estimates
        (all may be loaded at once) plus the daemon itself."""
        if self.memory_bytes is not None:
            return self.memory_bytes
        if self.estimates:
            return sum(self.estimates.values()) + DAEMON_MEMORY
        return DEFAULT_MEMORY

    @property
    def labels(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": "modelrunner", "app.kubernetes.io/instance": self.name}


def _metadata(options: DeployOptions, name: str) -> dict[str, Any]:
    return {"name": name, "namespace": options.namespace, "labels": options.labels}


def mebibytes(n_bytes: int) -> str:
    return f"{math.ceil(n_bytes / MiB)}Mi"


# -- a small YAML writer: block style, keys in the order given, strings quoted when YAML would misread them --

_PLAIN = re.compile(r"[A-Za-z_/.][A-Za-z0-9_./:@-]*")
_YAML_WORDS = {"yes", "no", "on", "off", "true", "false", "null", "y", "n", "~"}


def _scalar(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS and not text.endswith(":"):
        return text
    return json.dumps(text)  # a JSON string is a YAML string


def to_yaml(value: object, indent: int = 0) -> str:
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return pad + "{}\n"
        out = []
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                out.append(f"{pad}{_scalar(key)}:\n{to_yaml(item, indent + 2)}")
            else:
                out.append(f"{pad}{_scalar(key)}: {_inline(item)}\n")
        return "".join(out)
    if isinstance(value, list):
        if not value:
            return pad + "[]\n"
        out = []
        for item in value:
            if isinstance(item, dict | list) and item:
                nested = to_yaml(item, indent + 2)
                out.append(f"{pad}- {nested[indent + 2 :]}")
            else:
                out.append(f"{pad}- {_inline(item)}\n")
        return "".join(out)
    return pad + _scalar(value) + "\n"


def _inline(value: object) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


def documents(objects: list[dict[str, Any]], header: str) -> str:
    return header + "".join("---\n" + to_yaml(obj) for obj in objects)


# -- Kubernetes -----------------------------------------------------------------------------------------


def _daemon_container(options: DeployOptions, ray: bool) -> dict[str, Any]:
    memory = options.memory
    env: list[dict[str, Any]] = [
        {
            "name": "MODEL_RUNNER_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": options.api_key_secret, "key": "api-key"}},
        },
        {"name": "MODEL_RUNNER_MEMORY_BUDGET", "value": str(max(memory - DAEMON_MEMORY, 256 * MiB))},
    ]
    if ray:
        env.append({"name": "MODEL_RUNNER_RAY_ADDRESS", "value": f"127.0.0.1:{RAY_GCS_PORT}"})
    resources: dict[str, Any] = {
        "requests": {"cpu": str(options.cpus), "memory": mebibytes(memory)},
        "limits": {"cpu": str(options.cpus), "memory": mebibytes(memory)},
    }
    if options.gpu and not ray:  # with Ray the GPUs belong to the Ray containers
        resources["requests"][GPU_RESOURCES[options.gpu]] = 1
        resources["limits"][GPU_RESOURCES[options.gpu]] = 1
    probe = {"exec": {"command": ["python3", "-c", PROBE]}, "timeoutSeconds": 10, "failureThreshold": 3}
    mounts = [{"name": "data", "mountPath": "/data"}, {"name": "tmp", "mountPath": "/tmp"}]
    if ray:
        mounts.append({"name": "ray-session", "mountPath": "/tmp/ray"})
    return {
        "name": "modelrunner",
        "image": options.image_ref,
        "imagePullPolicy": "Always",
        "args": ["serve", "--host", "0.0.0.0", "--port", str(PORT)],
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "env": env,
        "resources": resources,
        "readinessProbe": {**probe, "initialDelaySeconds": 5, "periodSeconds": 10},
        "livenessProbe": {**probe, "initialDelaySeconds": 15, "periodSeconds": 20},
        "securityContext": _container_security(),
        "volumeMounts": mounts,
    }


def _container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": UID,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _pre_pull_container(options: DeployOptions) -> dict[str, Any]:
    return {
        "name": "pre-pull",
        "image": options.image_ref,
        "imagePullPolicy": "Always",
        "command": ["/bin/sh", "-ec", PRE_PULL, "pre-pull", *options.pre_pull],
        "resources": {
            "requests": {"cpu": "500m", "memory": "512Mi"},
            "limits": {"cpu": "1", "memory": "1Gi"},
        },
        "securityContext": _container_security(),
        "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "tmp", "mountPath": "/tmp"}],
    }


def _pod_spec(options: DeployOptions, containers: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": UID,
            "runAsGroup": UID,
            "fsGroup": UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if options.pre_pull:
        spec["initContainers"] = [_pre_pull_container(options)]
    spec["containers"] = containers
    return spec


def _service(options: DeployOptions, selector: dict[str, str], node_port: bool) -> dict[str, Any]:
    port: dict[str, Any] = {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}
    if node_port:
        port["nodePort"] = options.node_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(options, options.name + ("-nodeport" if node_port else "")),
        "spec": {"type": "NodePort" if node_port else "ClusterIP", "selector": selector, "ports": [port]},
    }


def _network_policy(
    options: DeployOptions, selector: dict[str, str], ports: list[int], peers: dict[str, str] | None = None
) -> dict[str, Any]:
    """Only the API port is open to clients (the API key guards it); with Ray, the cluster's pods may reach
    each other on any port (Ray's own, chosen at start). Egress stays open: pulls reach registries."""
    ingress: list[dict[str, Any]] = [{"ports": [{"protocol": "TCP", "port": port} for port in ports]}]
    if peers:
        ingress.append({"from": [{"podSelector": {"matchLabels": peers}}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(options, options.name),
        "spec": {"podSelector": {"matchLabels": selector}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def _services(options: DeployOptions, selector: dict[str, str]) -> list[dict[str, Any]]:
    out = [_service(options, selector, node_port=False)]
    if options.node_port is not None:
        out.append(_service(options, selector, node_port=True))
    return out


def kube_objects(options: DeployOptions) -> list[dict[str, Any]]:
    options.validate()
    if options.ray_workers:
        return _ray_objects(options)
    selector = options.labels
    tmp = {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}
    template = {
        "metadata": {"labels": selector},
        "spec": {**_pod_spec(options, [_daemon_container(options, ray=False)]), "volumes": [tmp]},
    }
    claim = {
        "metadata": {"name": "data", "labels": selector},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": options.storage}}},
    }
    stateful_set = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(options, options.name),
        "spec": {
            "replicas": options.replicas,
            "serviceName": options.name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector},
            "template": template,
            "volumeClaimTemplates": [claim],
        },
    }
    return [stateful_set, *_services(options, selector), _network_policy(options, selector, [PORT])]


def _ray_container(options: DeployOptions, name: str) -> dict[str, Any]:
    """A Ray node of the cluster: KubeRay runs `ray start` in it (the image's vLLM environment has Ray)."""
    gpu = GPU_RESOURCES["nvidia"]
    container: dict[str, Any] = {
        "name": name,
        "image": options.image_ref,
        "imagePullPolicy": "Always",
        "resources": {
            "requests": {"cpu": str(options.cpus), "memory": mebibytes(options.memory), gpu: 1},
            "limits": {"cpu": str(options.cpus), "memory": mebibytes(options.memory), gpu: 1},
        },
        "securityContext": _container_security(),
        # Ray writes its session (sockets, logs) under /tmp/ray, shared with the model runner on the head
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "ray-session", "mountPath": "/tmp/ray"},
        ],
    }
    if name == "ray-head":
        container["ports"] = [{"name": "gcs", "containerPort": RAY_GCS_PORT, "protocol": "TCP"}]
    return container


def _ray_objects(options: DeployOptions) -> list[dict[str, Any]]:
    """A RayCluster whose head pod also runs the model runner (the vLLM driver must be on a Ray node, and
    vLLM puts its first worker on the driver's node): the daemon reaches Ray at 127.0.0.1 and shares the
    head's session folder; the GPU workers are the worker group. One persistent store, on the head."""
    session = {"name": "ray-session", "emptyDir": {}}
    data = {"name": "data", "persistentVolumeClaim": {"claimName": f"{options.name}-data"}}
    tmp = {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}
    head_spec = _pod_spec(
        options, [_ray_container(options, "ray-head"), _daemon_container(options, ray=True)]
    )
    head_spec["volumes"] = [session, data, tmp]
    worker_spec = _pod_spec(replace(options, pre_pull=()), [_ray_container(options, "ray-worker")])
    worker_spec["volumes"] = [session, tmp]
    cluster = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": _metadata(options, options.name),
        "spec": {
            "rayVersion": _ray_version(),
            "headGroupSpec": {
                "rayStartParams": {"num-gpus": "1", "dashboard-host": "127.0.0.1"},
                "template": {"metadata": {"labels": options.labels}, "spec": head_spec},
            },
            "workerGroupSpecs": [
                {
                    "groupName": "gpu",
                    "replicas": options.ray_workers,
                    "minReplicas": options.ray_workers,
                    "maxReplicas": options.ray_workers,
                    "rayStartParams": {"num-gpus": "1"},
                    "template": {"metadata": {"labels": options.labels}, "spec": worker_spec},
                }
            ],
        },
    }
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(options, f"{options.name}-data"),
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": options.storage}}},
    }
    head = {"ray.io/cluster": options.name, "ray.io/node-type": "head"}
    # the head pod: the API from anywhere, Ray's ports from the cluster's own pods only
    ray_pods = {"ray.io/cluster": options.name}
    return [claim, cluster, *_services(options, head), _network_policy(options, head, [PORT], ray_pods)]


def _ray_version() -> str:
    from modelrunner.engines.ray_cluster import RAY_VERSION

    return RAY_VERSION


def kube(options: DeployOptions) -> str:
    objects = kube_objects(options)
    return documents(objects, _header(options, "kubectl apply -f FILE"))


def _header(options: DeployOptions, apply: str) -> str:
    if "kubectl" in apply:
        key = (
            f"# First: kubectl create namespace {options.namespace}; the API key: kubectl -n "
            f"{options.namespace} create secret generic {options.api_key_secret} "
            "--from-literal=api-key=$(openssl rand -hex 32)"
        )
    else:
        key = "# The API key: set MODEL_RUNNER_API_KEY in the environment or an .env file beside this file."
    lines = [
        f"# {options.command('kube' if 'kubectl' in apply else 'compose')}",
        f"# modelrunner {__version__}: generated by the command above ({apply}).",
        key,
        f"# Image: {options.image_ref} (deploy/image/build, pushed where the cluster can pull it).",
    ]
    if options.estimates:
        for model, size in sorted(options.estimates.items()):
            lines.append(f"# Memory estimate of {model}: {mebibytes(size)}.")
    return "\n".join(lines) + "\n"


# -- Compose ----------------------------------------------------------------------------------------------


def compose(options: DeployOptions) -> str:
    options.validate()
    if options.ray_workers:
        raise BadRequest("the Ray cluster option is for Kubernetes (KubeRay): use `model generate kube`")
    memory = options.memory
    service: dict[str, Any] = {
        "image": options.image_ref,
        "command": ["serve", "--host", "0.0.0.0", "--port", str(PORT)],
        # published on the host's loopback only, as the daemon listens when not in a container; replicas get
        # a host port each, chosen by Docker (also on loopback)
        "ports": [f"127.0.0.1:{PORT}:{PORT}" if options.replicas == 1 else f"127.0.0.1::{PORT}"],
        "environment": {
            "MODEL_RUNNER_API_KEY": "${MODEL_RUNNER_API_KEY:?set MODEL_RUNNER_API_KEY (the API key)}",
            "MODEL_RUNNER_MEMORY_BUDGET": str(max(memory - DAEMON_MEMORY, 256 * MiB)),
        },
        **compose_confinement(),
        "healthcheck": {
            "test": ["CMD", "python3", "-c", PROBE],
            "interval": "10s",
            "timeout": "10s",
            "retries": 3,
            "start_period": "15s",
        },
        "deploy": {
            "replicas": options.replicas,
            # Compose's units: m = MiB
            "resources": {"limits": {"cpus": str(options.cpus), "memory": f"{math.ceil(memory / MiB)}m"}},
        },
    }
    if options.gpu == "nvidia":
        devices = [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
        service["deploy"]["resources"]["reservations"] = {"devices": devices}
    elif options.gpu == "amd":
        service["devices"] = ["/dev/kfd", "/dev/dri"]
    services: dict[str, Any] = {}
    if options.pre_pull:
        services["pre-pull"] = {
            "image": options.image_ref,
            # `$$`: a literal `$` for the shell, not a variable of Compose's
            "entrypoint": ["/bin/sh", "-ec", PRE_PULL.replace("$", "$$"), "pre-pull", *options.pre_pull],
            **compose_confinement(),
        }
        service["depends_on"] = {"pre-pull": {"condition": "service_completed_successfully"}}
    services[options.name] = service
    document = {"name": options.name, "services": services, "volumes": {"modelrunner-data": {}}}
    return _header(options, "docker compose -f FILE up -d") + to_yaml(document)
