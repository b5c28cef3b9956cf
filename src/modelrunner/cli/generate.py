"""`model generate kube|compose`: print deployment manifests of the model runner (modelrunner/manifests.py).

Memory is requested from the daemon's estimate of each `--pre-pull` model (so those models must be in the
local store: pull them first), unless `--memory` gives it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from modelrunner.cli.common import UsageError


def _size(text: str) -> int:
    from modelrunner.scheduler.memory import parse_bytes

    try:
        return parse_bytes(text)
    except Exception:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 8GiB, 512MiB)") from None


def cmd_generate(args: argparse.Namespace) -> None:
    from modelrunner import manifests
    from modelrunner.errors import BadRequest, DaemonError

    estimates: dict[str, int] = {}
    if args.pre_pull and args.memory is None:
        from modelrunner.cli.common import client

        daemon = client()
        for model in args.pre_pull:
            try:
                estimates[model] = daemon.estimate(model).memory_bytes
            except DaemonError as exc:
                if exc.status_code != 404:
                    raise
                raise DaemonError(
                    404,
                    f"{model} is not in the local store, so its memory cannot be estimated: pull it first "
                    f"(model pull {model}), or give --memory (e.g. --memory 8GiB)",
                ) from None
    options = manifests.DeployOptions(
        name=args.name,
        namespace=args.namespace,
        image=args.image,
        replicas=args.replicas,
        gpu=args.gpu,
        pre_pull=tuple(args.pre_pull),
        storage=args.storage,
        api_key_secret=args.api_key_secret,
        node_port=args.node_port,
        memory_bytes=args.memory,
        cpus=args.cpus,
        ray_workers=args.ray_workers,
        estimates=estimates,
    )
    try:
        text = manifests.kube(options) if args.target == "kube" else manifests.compose(options)
    except BadRequest as exc:
        raise UsageError(exc.message) from None
    sys.stdout.write(text)


def add_commands(commands: Any) -> None:
    generate = commands.add_parser(
        "generate",
        help="Print Kubernetes or Compose manifests that run the model runner.",
        description="Print manifests that deploy the model runner: `kube` (a StatefulSet with a persistent "
        "store, Services, probes; with --ray-workers a KubeRay RayCluster for vLLM) or `compose`.",
    )
    generate.add_argument("target", choices=["kube", "compose"])
    generate.add_argument("--name", default="modelrunner", help="name of the objects (default modelrunner)")
    generate.add_argument(
        "--namespace", default="modelrunner", help="Kubernetes namespace (default modelrunner)"
    )
    generate.add_argument("--image", help="the image (default: what deploy/image/build tags)")
    generate.add_argument("--replicas", type=int, default=1, metavar="N", help="model runners (default 1)")
    generate.add_argument("--gpu", choices=["nvidia", "amd"], help="one GPU per model runner")
    generate.add_argument(
        "--pre-pull",
        nargs="+",
        default=[],
        metavar="MODEL",
        help="models pulled before the model runner starts; memory is requested from their estimates",
    )
    generate.add_argument("--storage", default="100Gi", metavar="SIZE", help="store size (default 100Gi)")
    generate.add_argument(
        "--api-key-secret",
        default="modelrunner-api-key",
        metavar="NAME",
        help="Secret with the API key (key `api-key`; default modelrunner-api-key)",
    )
    generate.add_argument("--node-port", type=int, metavar="PORT", help="also a NodePort Service on PORT")
    generate.add_argument("--memory", type=_size, metavar="SIZE", help="memory per model runner (e.g. 16GiB)")
    generate.add_argument(
        "--cpus", type=int, default=2, metavar="N", help="CPUs per model runner (default 2)"
    )
    generate.add_argument(
        "--ray-workers",
        type=int,
        default=0,
        metavar="N",
        help="kube: a KubeRay RayCluster with N GPU workers, for vLLM models across nodes",
    )
    generate.set_defaults(handler=cmd_generate)
