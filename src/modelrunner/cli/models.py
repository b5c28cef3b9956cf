"""Model verbs: package, list, inspect, show, tag, rm, df, purge."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from modelrunner.cli.common import DmrArgs, UsageError, client, display, short_id, takes

# Handlers import what they use when they run (start-up: see cli/__init__.py); errors is loaded already.
from modelrunner.errors import DaemonError, InvalidReference, status_line

if TYPE_CHECKING:
    from collections.abc import Callable

    from modelrunner.client import Client
    from modelrunner.client_types import Model

T = TypeVar("T")


def _absolute(path: str | None) -> str | None:
    return str(Path(path).expanduser().absolute()) if path else None


def _package_remotely(daemon: Client, request: dict[str, Any], target: str) -> str:
    """For a daemon on another machine: hash locally, then stream the artifact to it as a tar."""
    from modelrunner.artifact.builder import HashingSink, PackageSpec, build_artifact
    from modelrunner.artifact.tar_stream import file_chunks, tar_chunks

    def path(key: str) -> Path | None:
        return Path(request[key]) if request.get(key) else None

    spec = PackageSpec(
        gguf=path("gguf"),
        safetensors_dir=path("safetensors_dir"),
        dduf=path("dduf"),
        licenses=[Path(p) for p in request["licenses"]],
        mmproj=path("mmproj"),
        chat_template=path("chat_template"),
        context_size=request.get("context_size"),
        format=request.get("format"),
    )
    sink = HashingSink()
    built = build_artifact(spec, sink)
    entries: list[tuple[str, int, Any]] = []
    for blob in built.manifest.blobs:
        source = sink.files.get(blob.digest)
        content = file_chunks(source) if source is not None else [sink.blobs[blob.digest]]
        entries.append(("blobs/sha256/" + blob.digest.removeprefix("sha256:"), blob.size, content))
    entries.append(("manifest.json", len(built.manifest_bytes), [built.manifest_bytes]))
    model_id = daemon.load(tar_chunks(entries))
    daemon.tag_model(model_id, target)
    return model_id


# what a build reads of its environment (artifact/builder.py: created_time, and the local zone's TZ)
BUILD_VARIABLES = ("SOURCE_DATE_EPOCH", "TZ")


def _package_locally(daemon: Client, request: dict[str, Any], extends: bool) -> str | None:
    """The daemon on this machine reads the files itself, building as this process would (DMR's CLI builds
    in its own): with our SOURCE_DATE_EPOCH and time zone, not the daemon's. None when it refuses to read
    the files because we are not its user (403), so that they are uploaded instead: read with our rights,
    not the daemon's."""
    environment = {name: os.environ[name] for name in BUILD_VARIABLES if name in os.environ}
    try:
        return str(daemon.package({**request, "environment": environment})["id"])
    except DaemonError as exc:
        if exc.status_code != 403 or extends:
            raise
        return None


PACKAGE_USAGE = (
    "(--gguf <path> | --safetensors-dir <path> | --dduf <path> | --from <model>) [--license <path>...] "
    "[--mmproj <path>] [--context-size <tokens>] [--push] MODEL"
)
_PACKAGE_HELP = "\n\nSee 'docker model package --help' for more information"


def _step(text: str) -> None:
    """package.go's progress steps: on stderr (cmd.PrintErr), stdout keeps only the transfer's."""
    print(text, file=sys.stderr, flush=True)


def _package_steps(args: argparse.Namespace) -> None:
    """The steps package.go names before it builds (initializeBuilder, then the options it adds)."""
    from modelrunner.artifact.gojson import go_quote

    if args.from_model is not None:
        _step(f"Reading model from store: {go_quote(args.from_model)}")
        _step("Creating builder from existing model")
    elif args.gguf is not None:
        _step(f"Adding GGUF file from {go_quote(_absolute(args.gguf) or '')}")
        _require_file(args.gguf, "add gguf file")
    elif args.dduf is not None:
        _step(f"Adding DDUF file from {go_quote(_absolute(args.dduf) or '')}")
        _require_file(args.dduf, "add dduf file")
    else:
        _step(
            f"Scanning directory {go_quote(_absolute(args.safetensors_dir) or '')} for safetensors model..."
        )
    if args.context_size is not None:
        _step(f"Setting context size {args.context_size}")
    for path in args.license:
        _step(f"Adding license file from {go_quote(_absolute(path) or '')}")
        _require_file(path, "add license file")
    if args.chat_template:
        _step(f"Adding chat template file from {go_quote(_absolute(args.chat_template) or '')}")
        _require_file(args.chat_template, f"add chat template file from path {go_quote(args.chat_template)}")
    if args.mmproj:
        _step(f"Adding multimodal projector file from {go_quote(_absolute(args.mmproj) or '')}")
        _require_file(args.mmproj, "add multimodal projector file")


def _require_file(path: str, what: str) -> None:
    """package.go: a file its builder cannot open ends the command at that step, before anything is sent
    to the daemon (RunE's "Failed to package model" line, then `package model: <what>: open PATH: ...`)."""
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        cause = (exc.strerror or str(exc)).lower()  # Go's syscall text: "no such file or directory"
        shown = _absolute(path) or path
        raise UsageError(f"Failed to package model\npackage model: {what}: open {shown}: {cause}") from None


def _push_packaged(daemon: Client, args: argparse.Namespace) -> int:
    """`package --push`: DMR's one-step package and push of the target, its progress on stdout."""
    from modelrunner.cli.distribution import render_transfer

    _step("Pushing model to registry...")
    failed = render_transfer(daemon.push(args.target), False, "push", final=False)
    if not failed:
        _step("")
        _step("Model pushed successfully")
    return failed


def cmd_package(args: argparse.Namespace) -> int:
    sources = [s for s in (args.gguf, args.safetensors_dir, args.dduf, args.from_model) if s is not None]
    if not sources:  # package.go's Args
        raise UsageError("One of --gguf, --safetensors-dir, --dduf, or --from is required." + _PACKAGE_HELP)
    if len(sources) > 1:
        raise UsageError(
            "Cannot specify more than one of --gguf, --safetensors-dir, --dduf, or --from. "
            "Please use only one source." + _PACKAGE_HELP
        )
    if args.context_size is not None and args.context_size < 1:
        raise UsageError("--context-size must be a positive number of tokens")
    if args.format not in (None, "docker", "cncf"):
        raise UsageError(f'invalid --format value "{args.format}": must be "docker" or "cncf"')
    if args.format == "cncf" and args.context_size is not None:  # DMR's builder refuses it the same way
        raise UsageError(
            "--context-size is not supported with --format cncf: the CNCF ModelPack specification "
            "does not define a context size field"
        )
    daemon = client()
    lightweight = not (args.license or args.mmproj or args.chat_template) and args.format != "cncf"
    if args.from_model is not None and lightweight:
        # DMR's lightweight repackage: a new config over the same blobs.
        if args.context_size is not None and not args.push:  # package.go canUseDaemonRepackage
            from modelrunner.artifact.gojson import go_quote

            _step(f"Reading model from daemon: {go_quote(args.from_model)}")
            _step(f"Setting context size {args.context_size}")
        else:
            _package_steps(args)
        _step("Creating lightweight model variant...")
        daemon.repackage(args.from_model, args.target, args.context_size)
        _step("Model variant created successfully")
        return _push_packaged(daemon, args) if args.push else 0
    _package_steps(args)
    request: dict[str, Any] = {
        "target": args.target,
        "gguf": _absolute(args.gguf),
        "safetensors_dir": _absolute(args.safetensors_dir),
        "dduf": _absolute(args.dduf),
        "from": args.from_model,
        "licenses": [_absolute(p) for p in args.license],
        "mmproj": _absolute(args.mmproj),
        "chat_template": _absolute(args.chat_template),
        "context_size": args.context_size,
    }
    if args.format is not None:  # as DMR, only a format given: `--from` otherwise keeps the base's
        request["format"] = args.format
    if args.push:
        _package_built(daemon, request, args)
        return _push_packaged(daemon, args)
    _step("Loading model to Model Runner...")
    _package_built(daemon, request, args)
    _step("")
    _step("Model loaded successfully")
    return 0


def _package_built(daemon: Client, request: dict[str, Any], args: argparse.Namespace) -> str:
    """The artifact built and stored: by the daemon from the paths, else uploaded from here."""
    model_id = _package_locally(daemon, request, args.from_model is not None) if daemon.is_local else None
    if model_id is None:
        if args.from_model is not None:
            raise UsageError("--from with extra files needs a model runner on this machine")
        model_id = _package_remotely(daemon, request, args.target)
    return model_id


def _list_order(name: str) -> tuple[str, bool, str]:
    """DMR's `ls` order (cmd/cli/commands/list.go): by name before the last ':' (case-insensitive), a
    name without a tag first, then by tag (case-insensitive)."""
    base, colon, variant = name.rpartition(":")
    if not colon:
        return name.lower(), False, ""
    return base.lower(), True, variant.lower()


def _context_column(cfg: dict[str, Any]) -> str:
    """The context size, else a GGUF's `llama.context_length`, as DMR's `ls` fills the column."""
    context = cfg.get("context_size")
    if context:
        return str(context)
    gguf = cfg.get("gguf")
    value = gguf.get("llama.context_length") if isinstance(gguf, dict) else None
    return value if isinstance(value, str) and value.isdigit() else ""


def cmd_list(args: argparse.Namespace) -> int | None:
    from modelrunner.cli.dmrformat import go_table
    from modelrunner.cli.render import ago

    if args.openai or args.openaiurl:
        from modelrunner.cli.listing import openai_listing

        return openai_listing(args)
    models = client(quiet=args.json or args.quiet).list_models()
    if args.model:
        from modelrunner.cli.listing import filter_models

        models = filter_models(models, args.model)
    if args.json:
        from modelrunner.cli.dmrformat import standard_json

        # Go's nil slice when a filter matched nothing (list.go): `null`
        sys.stdout.write(standard_json([m.raw for m in models] if models or not args.model else None))
        return None
    if args.quiet:
        for model_id in dict.fromkeys(short_id(m.id) for m in models):
            print(model_id)
        return None
    rows = []
    for m in models:
        cfg = m.config
        for name in [display(t) for t in m.tags] or ["<none>"]:
            rows.append(
                [
                    name,
                    str(cfg.get("parameters", "")),
                    str(cfg.get("quantization", "")),
                    str(cfg.get("architecture", "")),
                    short_id(m.id),
                    ago(m.created),
                    _context_column(cfg),
                    str(cfg.get("size", "")),
                    *([_verified_column(m.raw)] if args.verified else []),
                ]
            )
    rows.sort(key=lambda row: _list_order(row[0]))
    headers = [
        "MODEL NAME",
        "PARAMETERS",
        "QUANTIZATION",
        "ARCHITECTURE",
        "MODEL ID",
        "CREATED",
        "CONTEXT",
        "SIZE",
        *(["VERIFIED"] if args.verified else []),
    ]
    sys.stdout.write(go_table(headers, rows))
    return None


def _verified_column(raw: dict[str, Any]) -> str:
    """`ls --verified`: who signed what the store verified (signing/record.py), `-` when nothing was, and
    whether the trust policy in force no longer trusts that signer."""
    verification = raw.get("verification")
    if not isinstance(verification, dict):
        return "-"
    signer = str(verification.get("signer", ""))[:19]
    return f"{signer} (no longer trusted)" if verification.get("notTrusted") else signer


def _inspected(name: str, fetch: Callable[[], T]) -> T:
    """A model as DMR's client inspects it (desktop.go listRawWithQuery), its failures in its words: a 404
    is `NAME: model not found`, another status `failed to list models: 500 Internal Server Error`."""
    try:
        return fetch()
    except DaemonError as exc:
        if exc.status_code == 404:
            raise DaemonError(404, f"{name}: model not found") from None
        if exc.status_code:
            raise DaemonError(
                exc.status_code, f"failed to list models: {status_line(exc.status_code)}"
            ) from None
        raise


def cmd_inspect(args: argparse.Namespace) -> None:
    """DMR's inspect.go: the model, or with --openai the daemon's OpenAI model object, as
    formatter.ToStandardJSON writes them."""
    from modelrunner.cli.dmrformat import openai_model_view, standard_json

    if args.openai and args.remote:
        raise UsageError("--remote flag cannot be used with --openai flag")
    daemon = client()
    if args.openai:
        sys.stdout.write(
            standard_json(openai_model_view(_inspected(args.model, lambda: daemon.openai_model(args.model))))
        )
        return
    model = _inspected(args.model, lambda: daemon.get_model(args.model, args.remote))
    sys.stdout.write(standard_json(model.raw))


def cmd_show(args: argparse.Namespace) -> None:
    daemon = client()
    sys.stdout.write(show_text(_inspected(args.model, lambda: daemon.get_model(args.model, args.remote))))


def show_text(model: Model) -> str:
    """show.go formatModelInfo: labels padded to 13 (14 for the config's), the tags as the daemon answers
    them, the creation time in RFC 3339 and the local zone, a blank line before the config and before each
    metadata section (Go walks a map in random order: sorted here)."""
    from modelrunner.artifact.gojson import local_rfc3339nano

    lines = [f"Model:       {model.id}"]
    if model.tags:
        lines.append(f"Tags:        {', '.join(model.tags)}")
    if model.created:
        lines.append(f"Created:     {local_rfc3339nano(model.created * 10**9)}")
    cfg = model.config
    if model.raw.get("config") is not None:  # show.go: no config section for a model without one
        lines.append("")
        for label, key in (
            ("Format:", "format"),
            ("Architecture:", "architecture"),
            ("Parameters:", "parameters"),
            ("Size:", "size"),
            ("Quantization:", "quantization"),
        ):
            if cfg.get(key):
                lines.append(f"{label:<14}{cfg[key]}")
        if cfg.get("context_size") is not None:
            lines.append(f"{'Context Size:':<14}{cfg['context_size']}")
        for title, key in (("GGUF", "gguf"), ("Safetensors", "safetensors"), ("Diffusers", "diffusers")):
            if cfg.get(key):
                lines += ["", f"{title} Metadata:", *(f"  {k}: {v}" for k, v in sorted(cfg[key].items()))]
    return "".join(line + "\n" for line in lines)


def _check_tag(target: str) -> None:
    """tag.go: the target must parse as a tag (reference.NewTag) before the daemon is asked."""
    import json

    from modelrunner.reference import parse_reference

    try:
        parsed = parse_reference(target)
    except InvalidReference as exc:
        raise UsageError(f"invalid tag: {exc}") from None
    if parsed.digest is not None:
        raise UsageError(f"invalid tag: reference {json.dumps(target)} is not a tag")


def cmd_tag(args: argparse.Namespace) -> None:
    _check_tag(args.target)
    try:
        client().tag_model(args.source, args.target)
    except DaemonError as exc:
        if not exc.status_code:
            raise
        # desktop.go Tag: any answer but 201
        message = f"tagging failed with status {status_line(exc.status_code)}: {exc.message}"
        raise DaemonError(exc.status_code, message) from None
    print(f'Model "{args.source}" tagged successfully with "{args.target}"')


def cmd_rm(args: argparse.Namespace) -> None:
    """DMR's rm.go and desktop.go Remove: the models in turn, each one's `Untagged:` and `Deleted:` lines as
    the daemon answers them; the first failure ends it (`no such model: NAME` for a 404)."""
    daemon = client()
    for name in args.models:
        try:
            events = daemon.delete_model(name, force=args.force)
        except DaemonError as exc:
            if exc.status_code == 404:
                raise DaemonError(404, f"no such model: {name}") from None
            if exc.status_code:
                message = f"removing {name} failed with status {status_line(exc.status_code)}: {exc.message}"
                raise DaemonError(exc.status_code, message) from None
            raise
        for event in events:
            for kind in ("Untagged", "Deleted"):
                if event.get(kind) is not None:
                    print(f"{kind}: {event[kind]}")


def cmd_export(args: argparse.Namespace) -> None:
    from modelrunner.fileio import write_stream_atomic

    output = Path(args.output)
    write_stream_atomic(output, client().export(args.model))
    print(f'Model "{args.model}" exported to {output}')


def cmd_load(args: argparse.Namespace) -> None:
    from modelrunner.artifact.tar_stream import file_chunks
    from modelrunner.fileio import require_regular_file

    source = Path(args.input)
    require_regular_file(source, "model archive")
    daemon = client()
    model_id = daemon.load(file_chunks(source))
    if args.tag:
        daemon.tag_model(model_id, args.tag)
    print(f"Loaded model {model_id}" + (f' as "{args.tag}"' if args.tag else ""))


def cmd_df(args: argparse.Namespace) -> None:
    """DMR's `df` (df.go): sizes as go-units' CustomSize; no engine row when it uses no space. Ours, with
    -v: then where the files are on this machine (store, runner home, engine cache) and their sizes."""
    from modelrunner.cli.dmrformat import custom_size, go_table

    usage = client().disk_usage()
    rows = [["Models", custom_size(usage.models)]]
    if usage.default_backend:
        rows.append(["Inference engine", custom_size(usage.default_backend)])
    sys.stdout.write(go_table(["TYPE", "SIZE"], rows))
    if args.verbose:
        _print_places()


def _print_places() -> None:
    from modelrunner import config
    from modelrunner.cli.storage import places_table, runner_is_here

    print()
    if not runner_is_here():
        print(f"The runner at {config.client_target().base_url} keeps its files on its own machine.")
        return
    sys.stdout.write(places_table())
    print(
        "\nThe engine cache is shared by every runner home of this user; uninstall-runner leaves it "
        "(a reinstall takes seconds)."
    )


def _scanln() -> str:
    """Go's `fmt.Scanln(&input)` as purge.go reads its answer, from whatever stdin is (`yes | model purge`):
    the line's one word ("" for an empty line); at the end of input Go's `EOF`, more words on the line
    `expected newline`, both errors that end the command."""
    line = sys.stdin.readline()
    words = line.split()
    if not line:
        raise UsageError("EOF")
    if len(words) > 1:
        raise UsageError("expected newline")
    return words[0] if words else ""


def confirm_removing_every_model(force: bool) -> bool:
    """purge.go's question, unless `force`: True when the answer is `y` or `Y`; otherwise says the
    operation is cancelled. Every verb that removes all models asks it (purge, stop-runner and
    uninstall-runner with --models)."""
    if force:
        return True
    print("WARNING! This will remove the entire models directory.")
    print("Are you sure you want to continue? [y/N] ", end="", flush=True)
    if _scanln() in ("y", "Y"):
        return True
    print("Operation cancelled.")
    return False


def cmd_purge(args: argparse.Namespace) -> None:
    """purge.go: asks unless --force (only `y` or `Y` goes on), unloads every model, purges, and prints
    nothing more; its failures in handleClientError's words."""
    if not confirm_removing_every_model(args.force):
        return
    daemon = client()
    try:
        daemon.unload([], True, None)
    except DaemonError as exc:
        raise DaemonError(exc.status_code, f"Failed to unload models: {exc.message}") from None
    try:
        daemon.purge()
    except DaemonError as exc:
        if exc.status_code:  # desktop.go Purge: any answer but 200
            message = f"purging failed with status {status_line(exc.status_code)}: {exc.message}"
            raise DaemonError(exc.status_code, f"Failed to purge: {message}") from None
        raise DaemonError(0, f"Failed to purge: {exc.message}") from None


def add_commands(commands: Any) -> None:
    package = commands.add_parser(
        "package",
        help="Package a GGUF file, safetensors folder or DDUF file into a model artifact.",
        description="Package model files into a DMR-compatible OCI artifact in the local store.",
    )
    package.add_argument("target", nargs="?", help="tag for the packaged model, e.g. myorg/mymodel:Q4_K_M")
    takes(package, DmrArgs("package", PACKAGE_USAGE, "target"))
    package.add_argument("--gguf", metavar="PATH", help="GGUF file (the other shards of a set are found)")
    package.add_argument(
        "--safetensors-dir", "--safetensors", metavar="DIR", help="folder of a safetensors model"
    )
    package.add_argument("--dduf", metavar="PATH", help="diffusers DDUF file")
    package.add_argument("--from", dest="from_model", metavar="MODEL", help="existing model to repackage")
    package.add_argument(
        "-l", "--license", action="append", default=[], metavar="PATH", help="license (repeatable)"
    )
    package.add_argument("--mmproj", metavar="PATH", help="multimodal projector file")
    package.add_argument("--chat-template", metavar="PATH", help="Jinja chat template file")
    package.add_argument("--context-size", type=int, metavar="N", help="default context size in tokens")
    package.add_argument("--push", action="store_true", help="push the target to its registry once packaged")
    package.add_argument(
        "--format",
        help='artifact format: "docker" (default; with --from, the model\'s own) or "cncf" (CNCF ModelPack)',
    )
    package.set_defaults(handler=cmd_package)

    listing = commands.add_parser("list", aliases=["ls"], help="List the models in the local store.")
    listing.add_argument(
        "model",
        nargs="?",
        help="only this repository's models, as DMR matches them: the whole name, not a part of it "
        "(`smollm2` is ai/smollm2; with :TAG only that tag)",
    )
    listing.add_argument("--json", action="store_true", help="raw JSON of the API")
    listing.add_argument("-q", "--quiet", action="store_true", help="only model IDs")
    listing.add_argument("--openai", action="store_true", help="List models in an OpenAI format")
    listing.add_argument("--verified", action="store_true", help="a column: the signer the store verified")
    listing.add_argument(
        "--openaiurl", metavar="URL", help="OpenAI-compatible API endpoint URL to list models from"
    )
    takes(listing, DmrArgs("ls", "[OPTIONS] [MODEL]", "model", cobra=("max", 1)))  # list.go: MaximumNArgs(1)
    listing.set_defaults(handler=cmd_list)

    inspect = commands.add_parser("inspect", help="Show a model's details as JSON.")
    inspect.add_argument("model", nargs="?", help="model name, tag or ID")
    takes(inspect, DmrArgs("inspect", "MODEL", "model", failure="Failed to get model {model}"))
    inspect.add_argument("--openai", action="store_true", help="as an OpenAI model object")
    inspect.add_argument(
        "-r", "--remote", action="store_true", help="read it from its registry, without pulling"
    )
    inspect.set_defaults(handler=cmd_inspect)

    show = commands.add_parser("show", help="Show a model's details, readable by a person.")
    show.add_argument("model", nargs="?", help="model name, tag or ID")
    takes(show, DmrArgs("show", "MODEL", "model", failure="Failed to get model {model}"))
    show.add_argument(
        "-r", "--remote", action="store_true", help="read it from its registry, without pulling"
    )
    show.set_defaults(handler=cmd_show)

    tag = commands.add_parser("tag", help="Give a model another tag (a tag held by another model moves).")
    tag.add_argument("source", nargs="?", help="model name, tag or ID")
    tag.add_argument("target", nargs="?", help="new tag")
    takes(tag, DmrArgs("tag", "SOURCE TARGET", "source", "target", failure="failed to tag model"))
    tag.set_defaults(handler=cmd_tag)

    rm = commands.add_parser("rm", help="Remove models from the local store.")
    rm.add_argument("models", nargs="*", metavar="MODEL")
    takes(rm, DmrArgs("rm", "[MODEL...]", "models", at_least=True, failure="Failed to remove model"))
    rm.add_argument(
        "-f", "--force", action="store_true", help="remove a model by ID even when it has many tags"
    )
    rm.set_defaults(handler=cmd_rm)

    export = commands.add_parser("export", help="Write a model to a tar archive (DMR's export format).")
    export.add_argument("model", help="model name, tag or ID")
    export.add_argument("-o", "--output", required=True, metavar="FILE", help="archive to write")
    export.set_defaults(handler=cmd_export)

    load = commands.add_parser("load", help="Load a model from a tar archive made by `model export`.")
    load.add_argument("input", metavar="FILE", help="archive to read")
    load.add_argument("-t", "--tag", help="tag to give the loaded model")
    load.set_defaults(handler=cmd_load)

    df = commands.add_parser("df", help="Show disk usage of models and engines.")
    df.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also where the files are: model store, runner home, engine cache, with their sizes",
    )
    takes(df, DmrArgs("df", "", counted=False))
    df.set_defaults(handler=cmd_df)

    purge = commands.add_parser("purge", help="Remove every model from the local store.")
    purge.add_argument("-f", "--force", action="store_true", help="do not ask for confirmation")
    takes(purge, DmrArgs("purge", "[OPTIONS]", counted=False))
    purge.set_defaults(handler=cmd_purge)
