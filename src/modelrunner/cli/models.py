"""Model verbs: package, list, inspect, show, tag, rm, df, purge."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from modelrunner.client import Client


def _client() -> Client:
    from modelrunner.client import connect

    return connect()


def _display(tag: str) -> str:
    from modelrunner.reference import display_name

    return display_name(tag)


def _short_id(model_id: str) -> str:
    return model_id.removeprefix("sha256:")[:12]


def _absolute(path: Path | None) -> str | None:
    return str(path.expanduser().absolute()) if path is not None else None


def _package_remotely(client: Client, request: dict[str, Any], target: str) -> str:
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
    )
    sink = HashingSink()
    built = build_artifact(spec, sink)
    entries: list[tuple[str, int, Any]] = []
    for blob in built.manifest.blobs:
        name = "blobs/sha256/" + blob.digest.removeprefix("sha256:")
        source = sink.files.get(blob.digest)
        content = file_chunks(source) if source is not None else [sink.blobs[blob.digest]]
        entries.append((name, blob.size, content))
    entries.append(("manifest.json", len(built.manifest_bytes), [built.manifest_bytes]))
    model_id = client.load(tar_chunks(entries))
    client.tag_model(model_id, target)
    return model_id


def register(app: typer.Typer) -> None:
    @app.command()
    def package(
        target: Annotated[str, typer.Argument(help="Tag for the packaged model, e.g. myorg/mymodel:Q4_K_M.")],
        gguf: Annotated[Path | None, typer.Option(help="GGUF file (shards of a set are found).")] = None,
        safetensors_dir: Annotated[
            Path | None,
            typer.Option("--safetensors-dir", "--safetensors", help="Folder of a safetensors model."),
        ] = None,
        dduf: Annotated[Path | None, typer.Option(help="Diffusers DDUF file.")] = None,
        from_model: Annotated[str | None, typer.Option("--from", help="Existing model to repackage.")] = None,
        license: Annotated[
            list[Path] | None, typer.Option("--license", "-l", help="License file (repeatable).")
        ] = None,
        mmproj: Annotated[Path | None, typer.Option(help="Multimodal projector file.")] = None,
        chat_template: Annotated[Path | None, typer.Option(help="Jinja chat template file.")] = None,
        context_size: Annotated[
            int | None, typer.Option(help="Default context size in tokens.", min=1)
        ] = None,
    ) -> None:
        """Package a GGUF file, safetensors folder or DDUF file into a model artifact."""
        client = _client()
        sources = [s for s in (gguf, safetensors_dir, dduf, from_model) if s is not None]
        if len(sources) != 1:
            raise typer.BadParameter("give exactly one of --gguf, --safetensors-dir, --dduf or --from")
        only_context = from_model is not None and not (license or mmproj or chat_template)
        if only_context:  # DMR's lightweight repackage: new config, same blobs
            assert from_model is not None
            result = client.repackage(from_model, target, context_size)
            typer.echo(
                f'Model "{from_model}" repackaged successfully as "{target}" ({_short_id(result["id"])})'
            )
            return
        request: dict[str, Any] = {
            "target": target,
            "gguf": _absolute(gguf),
            "safetensors_dir": _absolute(safetensors_dir),
            "dduf": _absolute(dduf),
            "from": from_model,
            "licenses": [_absolute(p) for p in license or []],
            "mmproj": _absolute(mmproj),
            "chat_template": _absolute(chat_template),
            "context_size": context_size,
        }
        if client.is_local:
            model_id = client.package(request)["id"]
        elif from_model is not None:
            raise typer.BadParameter("--from with extra files needs a daemon on this machine")
        else:
            model_id = _package_remotely(client, request, target)
        typer.echo(f'Model "{target}" packaged successfully ({_short_id(model_id)})')

    @app.command("list")
    def list_models(
        model: Annotated[str | None, typer.Argument(help="Only models whose name contains this.")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Raw JSON of the API.")] = False,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only model IDs.")] = False,
    ) -> None:
        """List the models in the local store."""
        _list(model, as_json, quiet)

    @app.command("ls", hidden=True)
    def ls(
        model: Annotated[str | None, typer.Argument()] = None,
        as_json: Annotated[bool, typer.Option("--json")] = False,
        quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
    ) -> None:
        """List the models in the local store."""
        _list(model, as_json, quiet)

    @app.command()
    def inspect(
        model: Annotated[str, typer.Argument(help="Model name, tag or ID.")],
        openai: Annotated[bool, typer.Option("--openai", help="As an OpenAI model object.")] = False,
    ) -> None:
        """Show a model's details as JSON."""
        data = _client().get_model(model)
        if openai:
            data = {
                "id": data["tags"][0] if data["tags"] else data["id"],
                "object": "model",
                "created": data["created"],
                "owned_by": "docker",
            }
        typer.echo(json.dumps(data, indent=2))

    @app.command()
    def show(model: Annotated[str, typer.Argument(help="Model name, tag or ID.")]) -> None:
        """Show a model's details, readable by a person."""
        from datetime import UTC, datetime

        data = _client().get_model(model)
        cfg: dict[str, Any] = data.get("config") or {}
        created = datetime.fromtimestamp(data.get("created") or 0, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        lines = [
            f"Model: {data['id']}",
            "Tags: " + (", ".join(_display(t) for t in data["tags"]) or "<none>"),
            f"Created: {created}",
        ]
        for label, key in (
            ("Format", "format"),
            ("Architecture", "architecture"),
            ("Parameters", "parameters"),
            ("Size", "size"),
            ("Quantization", "quantization"),
            ("Context Size", "context_size"),
        ):
            if cfg.get(key) not in (None, ""):
                lines.append(f"{label}: {cfg[key]}")
        for label, key in (("GGUF", "gguf"), ("Safetensors", "safetensors"), ("Diffusers", "diffusers")):
            section = cfg.get(key)
            if section:
                lines.append(f"{label} Metadata:")
                lines += [f"  {k}: {v}" for k, v in sorted(section.items())]
        typer.echo("\n".join(lines))

    @app.command()
    def tag(
        source: Annotated[str, typer.Argument(help="Model name, tag or ID.")],
        target: Annotated[str, typer.Argument(help="New tag.")],
    ) -> None:
        """Give a model another tag (a tag held by another model moves)."""
        _client().tag_model(source, target)
        typer.echo(f'Model "{source}" tagged successfully with "{target}"')

    @app.command("rm")
    def rm(
        models: Annotated[list[str], typer.Argument(help="Models to remove.")],
        force: Annotated[
            bool, typer.Option("--force", "-f", help="Remove a model by ID even with many tags.")
        ] = False,
    ) -> None:
        """Remove models from the local store."""
        from modelrunner.client import DaemonError

        client = _client()
        failed = False
        for name in models:
            try:
                for event in client.delete_model(name, force=force):
                    for kind, value in event.items():
                        typer.echo(f"{kind}: {_display(value) if kind == 'Untagged' else value}")
            except DaemonError as exc:
                print(f"Error: {exc.message}", file=sys.stderr)
                failed = True
        if failed:
            raise typer.Exit(code=1)

    @app.command()
    def df() -> None:
        """Show disk usage of models and engines."""
        from modelrunner.cli.render import decimal_size, table

        usage = _client().disk_usage()
        rows = [
            ["Models", decimal_size(usage["models_disk_usage"])],
            ["Inference engine", decimal_size(usage["default_backend_disk_usage"])],
        ]
        typer.echo(table(["TYPE", "SIZE"], rows))

    @app.command()
    def purge(
        force: Annotated[bool, typer.Option("--force", "-f", help="Do not ask for confirmation.")] = False,
    ) -> None:
        """Remove every model from the local store."""
        if not force:
            if not sys.stdin.isatty():
                raise typer.BadParameter("purge deletes every model; confirm with --force")
            if not typer.confirm("This removes every model in the store. Continue?"):
                raise typer.Exit(code=1)
        _client().purge()
        typer.echo("Model store purged")


def _list(model: str | None, as_json: bool, quiet: bool) -> None:
    from modelrunner.cli.render import ago, table

    models = _client().list_models()
    if model:
        needle = model.lower()
        models = [
            m for m in models if any(needle in t.lower() for t in m["tags"]) or m["id"].startswith(needle)
        ]
    if as_json:
        typer.echo(json.dumps(models, indent=2))
        return
    if quiet:
        seen: list[str] = []
        for m in models:
            if _short_id(m["id"]) not in seen:
                seen.append(_short_id(m["id"]))
        if seen:
            typer.echo("\n".join(seen))
        return
    rows = []
    for m in models:
        cfg = m.get("config") or {}
        context = cfg.get("context_size")
        for name in [_display(t) for t in m["tags"]] or ["<none>"]:
            rows.append(
                [
                    name,
                    str(cfg.get("parameters", "")),
                    str(cfg.get("quantization", "")),
                    str(cfg.get("architecture", "")),
                    _short_id(m["id"]),
                    ago(int(m.get("created") or 0)),
                    str(context) if context else "",
                    str(cfg.get("size", "")),
                ]
            )
    rows.sort(key=lambda row: row[0])
    headers = [
        "MODEL NAME",
        "PARAMETERS",
        "QUANTIZATION",
        "ARCHITECTURE",
        "MODEL ID",
        "CREATED",
        "CONTEXT",
        "SIZE",
    ]
    typer.echo(table(headers, rows))
