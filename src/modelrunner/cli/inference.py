"""Inference and scheduler verbs: run (one-shot and interactive chat), ps, unload, configure, logs.

Output and flags follow DMR's commands (`cmd/cli/commands/run.go`, `ps.go`, `unload.go`, `configure*.go`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from modelrunner.cli.common import DmrArgs, UsageError, client, display, takes

if TYPE_CHECKING:
    from modelrunner.client import Client
    from modelrunner.client_types import Runner

DEFAULT_KEEP_ALIVE = 300.0  # DMR's KeepAliveDefault, shown when a runner reports none
COLOR_MODES = ("auto", "yes", "no")  # run.go's --color
UNLOAD_USAGE = "(MODEL [MODEL ...] [--backend BACKEND] | --all)"  # unload.go's cmdArgs


def ensure_model(daemon: Client, model: str) -> None:
    """`run` pulls a model that is not in the store yet, as DMR's run.go does (its notice on stdout, then
    pullModel as `model pull`), stopping on its error (instead of a later, unrelated 404)."""
    from modelrunner.cli.distribution import pull_model
    from modelrunner.errors import DaemonError

    try:
        daemon.get_model(model)
        return
    except DaemonError as exc:
        if exc.status_code != 404:
            raise
    print(f"Unable to find model '{model}' locally. Pulling from the server.", flush=True)
    status = pull_model(daemon, model)
    if status != 0:
        raise SystemExit(status)


def _prompt(args: argparse.Namespace) -> str:
    """run.go: the words after the model, and stdin appended as it is (its bytes, its last newline)
    when it is not a character device (a pipe or a file: /dev/null and a terminal are not read)."""
    import os
    import stat

    prompt = " ".join(args.prompt)
    try:
        piped = not args.detach and not stat.S_ISCHR(os.fstat(sys.stdin.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):  # no stdin at all
        piped = False
    if piped:
        data = sys.stdin.buffer.read().decode("utf-8", "replace")  # no newline translation
        prompt = f"{prompt}\n\n{data}" if prompt else data
    return prompt


def _use_color(mode: str) -> bool:
    if mode == "yes":
        return True
    if mode == "no":
        return False
    import os

    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


def cmd_run(args: argparse.Namespace) -> int:
    from modelrunner.cli.engines import with_engine_installed
    from modelrunner.cli.prompt_files import PromptFileError, user_message
    from modelrunner.cli.websearch import answerer

    if args.color not in COLOR_MODES:  # run.go's PreRunE
        raise UsageError(f"--color must be one of: {', '.join(COLOR_MODES)} (got {json.dumps(args.color)})")
    prompt = _prompt(args)
    if args.debug:
        print(f"Running model {args.model} with prompt {prompt}" if prompt else f"Running model {args.model}")
    color = _use_color(args.color)
    if args.openaiurl:
        if args.detach:
            raise UsageError("--detach flag cannot be used with --openaiurl flag")
        from modelrunner.client import Client

        daemon = Client.for_openai_url(args.openaiurl)
    else:
        daemon = client()
        ensure_model(daemon, args.model)
        from modelrunner.cli.images import is_image_model, run_image, warn_image_flags_ignored

        if is_image_model(daemon.get_model(args.model)):  # a DDUF model: a picture, not a chat
            args.prompt = [prompt] if prompt else []  # stdin is read already
            return run_image(daemon, args)
        warn_image_flags_ignored(args)
        if args.detach:
            with_engine_installed(daemon, lambda: daemon.preload(args.model, args.backend))
            if args.debug:
                print(f"Model {args.model} loaded successfully")
            return 0
    if prompt:  # run.go: any prompt, even a blank one, is a one-shot answer
        try:
            message = user_message(prompt)
        except PromptFileError as exc:
            raise UsageError(str(exc)) from None
        options = {"max_tokens": args.max_tokens} if args.max_tokens else {}
        answer = answerer(args.websearch)
        with_engine_installed(
            daemon, lambda: answer(daemon, args.model, [message], args.backend, color, **options)
        )
        print()
        return 0
    from modelrunner.cli.chat import interactive_chat

    return interactive_chat(
        daemon, args.model, args.backend, color, preload=not args.openaiurl, websearch=args.websearch
    )


def _parse_go_time(text: object) -> float | None:
    """Seconds since the epoch of an RFC 3339 time; None for Go's zero time or anything else."""
    from modelrunner.artifact import gojson

    if not isinstance(text, str) or text == gojson.ZERO_TIME:
        return None
    try:
        return gojson.parse_time(text).timestamp()
    except ValueError:
        return None


def until(runner: Runner, now: float) -> str:
    """The UNTIL column of DMR's `ps` (formatUntil): how long an idle runner stays loaded."""
    from modelrunner.cli.render import human_duration
    from modelrunner.scheduler.durations import NEVER, parse_keep_alive

    if runner.loading:
        return "Loading..."
    raw = runner.keep_alive
    try:
        keep_alive = DEFAULT_KEEP_ALIVE if raw is None else parse_keep_alive(raw)
    except ValueError:
        keep_alive = DEFAULT_KEEP_ALIVE
    if keep_alive == NEVER:
        return "Forever"
    last_used = _parse_go_time(runner.last_used)
    if runner.in_use or last_used is None:
        return human_duration(keep_alive) + " from now"
    remaining = keep_alive - (now - last_used)
    return "Expiring" if remaining <= 0 else human_duration(remaining) + " from now"


def ps_name(model_name: str) -> str:
    return model_name[7:19] if model_name.startswith("sha256:") else display(model_name.lower())


def layout_text(layout: dict[str, Any]) -> str:
    """A runner spread beyond its process: `rpc 10.0.0.2:50052,10.0.0.3:50052`, `tp 2 x pp 1 on ray ...`."""
    if layout.get("rpc_workers"):
        return "rpc " + ",".join(layout["rpc_workers"])
    text = f"tp {layout.get('tensor_parallel_size', 1)} x pp {layout.get('pipeline_parallel_size', 1)}"
    if layout.get("ray_address"):
        text += f" on ray {layout['ray_address']} ({layout.get('local_workers', 1)} here)"
    return text


def drafting_text(drafting: dict[str, Any]) -> str:
    """`ngram-mod: 94% of 3,075 accepted`, or the types alone before any draft (or when unknown)."""
    types, drafted = str(drafting.get("types", "")), drafting.get("drafted_tokens")
    if not isinstance(drafted, int) or not drafted:
        return types
    return f"{types}: {drafting.get('accepted_tokens', 0) / drafted:.0%} of {drafted:,} accepted"


def cmd_ps(_: argparse.Namespace) -> None:
    from modelrunner.cli.dmrformat import go_table

    now = time.time()
    runners = client().ps()
    rows = [[ps_name(r.model_name), r.backend_name, r.mode, until(r, now)] for r in runners]
    headers = ["MODEL NAME", "BACKEND", "MODE", "UNTIL"]
    if any(r.layout for r in runners):  # ours: a column only when some model is spread out
        headers.append("LAYOUT")
        for row, runner in zip(rows, runners, strict=True):
            row.append(layout_text(runner.layout) if runner.layout else "")
    if any(r.raw.get("drafting") for r in runners):  # ours: speculative decoding, a column when some drafts
        headers.append("DRAFTING")
        for row, runner in zip(rows, runners, strict=True):
            row.append(drafting_text(runner.raw.get("drafting") or {}))
    warm = [runner.raw.get("warm") or {} for runner in runners]  # ours: a prompt cache restored at load
    if any(state.get("state") == "restored" for state in warm):
        headers.append("WARM")
        for row, state in zip(rows, warm, strict=True):
            restored = state.get("state") == "restored"
            row.append(f"{state.get('restored_tokens')} tokens restored" if restored else "")
    sys.stdout.write(go_table(headers, rows))


def cmd_unload(args: argparse.Namespace) -> None:
    """unload.go: its Args check in its words (the command path as invoked), then the unload."""
    path = f"{args.prog} unload"
    if args.all and args.models:
        problem = "does not take MODEL when --all is specified"
    elif not args.all and not args.models:
        problem = "requires MODEL unless --all is specified"
    else:
        problem = ""
    if problem:
        raise UsageError(
            f"'{path}' {problem}.\n\nUsage:  {path} {UNLOAD_USAGE}\n\n"
            f"See '{path} --help' for more information."
        )
    daemon = client()
    count = daemon.unload(args.models, args.all, args.backend)
    busy = [] if count or args.all else _in_use(daemon.ps(), args.models)
    if count:
        print(f"Unloaded {count} model(s).")
    elif args.all:
        print("No models are running.")
    elif busy:  # ours: DMR says "No such model(s) running." while `ps` lists them answering requests
        print(
            f"Not unloaded: {', '.join(busy)} {'is' if len(busy) == 1 else 'are'} answering requests; "
            "a runner in use is left alone, unload it again when it is idle."
        )
    else:
        print("No such model(s) running.")


def _in_use(runners: list[Runner], names: list[str]) -> list[str]:
    """The `ps` names of the runners in use that one of `names` names, as the daemon's unload finds them
    (server/admin_serving.py names_runner: any spelling of the name it was loaded under, or its ID)."""
    from modelrunner.server.admin_serving import names_runner

    return [
        ps_name(runner.model_name)
        for runner in runners
        if runner.in_use
        and any(names_runner(name, runner.model_name, str(runner.raw.get("model_id", ""))) for name in names)
    ]


def _parse_bool(text: str) -> bool:
    """DMR's `--think=<bool>`: its value as Go's strconv.ParseBool reads it."""
    from modelrunner.artifact.gojson import parse_bool

    value = parse_bool(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")
    return value


def _draft_type(text: str) -> bool | str:
    """`--draft-from-context=VALUE`: a boolean as Go reads one, else a type (the daemon checks it)."""
    from modelrunner.artifact.gojson import parse_bool

    value = parse_bool(text)
    return text if value is None else value


def _configure_words_error(args: argparse.Namespace) -> str | None:
    """configure.go's Args (exactly one model, before `--` when one is given), and `configure show`'s
    cobra.MaximumNArgs(1); None when the words fit."""
    from modelrunner.cli.common import cobra_count_error

    if args.model == "show":
        return cobra_count_error("max", 1, len(args.target))
    words = [word for word in (args.model, *args.target) if word is not None]
    if len(words) == 1:
        return None
    see = f"\n\nSee '{args.prog} configure --help' for more information"
    if args.dashed:
        return f"Exactly one model must be specified before --, got {len(words)}{see}"
    listed = " ".join(words)  # Go's %v of the words
    return f"Exactly one model must be specified, got {len(words)}: [{listed}]{see}"


def _require_model(daemon: Client, model: str, prog: str) -> None:
    """Settings for a model that is not in the store would be kept and never used (a typo goes unseen):
    the CLI refuses them. DMR's daemon takes them (Scheduler.ConfigureRunner keys them by the name when
    GetLocal fails), so an API client may still configure before it pulls; the check is the CLI's."""
    from modelrunner.errors import DaemonError

    try:
        daemon.get_model(model)
    except DaemonError as exc:
        if exc.status_code != 404:
            raise
        print(
            f"Failed to configure {model}: model not found (pull it first: {prog} pull {model})",
            file=sys.stderr,
        )
        raise SystemExit(1) from None


def cmd_configure(args: argparse.Namespace) -> None:
    error = _configure_words_error(args)
    if error is not None:
        raise UsageError(error)
    daemon = client()
    if args.model == "show":
        from modelrunner.artifact import gojson

        target = args.target[0] if args.target else None
        print(gojson.dumps_text([entry.raw for entry in daemon.configuration(target)], indent="  "))
        return
    _require_model(daemon, args.model, args.prog)
    flags = args.passthrough
    request: dict[str, Any] = {"model": args.model}
    if args.context_size is not None:
        request["context-size"] = args.context_size
    if flags:
        request["runtime-flags"] = flags
    if args.keep_alive is not None:
        request["keep_alive"] = args.keep_alive
    if args.mode:
        request["mode"] = args.mode
    llamacpp: dict[str, Any] = {}
    if args.think is not None:
        llamacpp["reasoning-budget"] = -1 if args.think else 0
    if args.rpc is not None:  # "" turns the workers off
        llamacpp["rpc"] = [worker.strip() for worker in args.rpc.split(",") if worker.strip()]
    if args.kv_persist is not None:
        llamacpp["kv-persist"] = args.kv_persist
    if args.draft_from_context is not None:
        llamacpp["draft-from-context"] = args.draft_from_context
    if llamacpp:
        request["llamacpp"] = llamacpp
    vllm: dict[str, Any] = {}
    if args.hf_overrides is not None:
        try:
            vllm["hf-overrides"] = json.loads(args.hf_overrides)
        except ValueError:
            raise UsageError("--hf_overrides must be a JSON object") from None
    if args.gpu_memory_utilization is not None:
        vllm["gpu-memory-utilization"] = args.gpu_memory_utilization
    for key in ("tensor-parallel-size", "pipeline-parallel-size", "ray-address"):
        value = getattr(args, key.replace("-", "_"))
        if value is not None:
            vllm[key] = value
    if vllm:
        request["vllm"] = vllm
    speculative = {
        key: value
        for key, value in (
            ("draft_model", args.speculative_draft_model),
            ("num_tokens", args.speculative_num_tokens),
            ("min_acceptance_rate", args.speculative_min_acceptance_rate),
        )
        if value is not None
    }
    if speculative:
        request["speculative"] = speculative
    # `configure MODEL` alone is sent too, as DMR's configure.go does: it resets the model to its defaults
    daemon.configure(request, args.backend)  # and nothing printed, as DMR's configure.go prints nothing


def cmd_logs(args: argparse.Namespace) -> None:
    out = sys.stdout.buffer
    for chunk in client().logs(args.follow, args.no_engines, args.model):
        out.write(chunk)
        out.flush()


def add_commands(commands: Any) -> None:
    run = commands.add_parser("run", help="Run a model: one answer to a prompt, or an interactive chat.")
    run.add_argument("model", nargs="?", help="model name, tag or ID")
    run.add_argument("prompt", nargs="*", help="prompt (stdin is appended when piped); none = chat")
    takes(run, DmrArgs("run", "MODEL [PROMPT]", "model", "prompt", at_least=True))
    run.add_argument("--backend", help="engine to use (llama.cpp, vllm, diffusers)")
    run.add_argument("-d", "--detach", action="store_true", help="load the model in the background only")
    run.add_argument("--color", default="no", help="use colored output: auto, yes or no (default no)")
    run.add_argument("--debug", action="store_true", help="say what is run")
    run.add_argument("--openaiurl", metavar="URL", help="chat with this OpenAI-compatible endpoint instead")
    run.add_argument("--max-tokens", type=int, metavar="N", help="stop the answer after N tokens")
    run.add_argument("--websearch", action="store_true", help="Enable web search tool during chat")
    run.add_argument("-o", "--output", metavar="FILE", help="image models: the PNG to write")
    run.add_argument("--size", metavar="WxH", help="image models: width x height (default 512x512)")
    run.add_argument(
        "--steps",
        type=int,
        metavar="N",
        help="image models: inference steps (default 50, as in the dashboard)",
    )
    run.add_argument("--seed", type=int, metavar="N", help="image models: seed, for a repeatable image")
    run.set_defaults(handler=cmd_run)

    commands.add_parser("ps", help="List the models loaded in engines.").set_defaults(handler=cmd_ps)

    unload = commands.add_parser("unload", aliases=["stop"], help="Unload models from their engines.")
    unload.add_argument("models", nargs="*", metavar="MODEL")
    unload.add_argument("--all", action="store_true", help="unload every idle model")
    unload.add_argument("--backend", help="only runners of this engine")
    unload.set_defaults(handler=cmd_unload)

    configure = commands.add_parser(
        "configure",
        aliases=["config"],
        help="Set a model's engine settings, all at once: what is left out is back to its default (kept "
        "across restarts); `configure show [MODEL]` lists them.",
    )
    # the words are counted by configure.go's rule (cmd_configure), not by argparse
    configure.add_argument(
        "model", nargs="?", help="model name, tag or ID (or `show`); engine flags follow a --"
    )
    configure.add_argument("target", nargs="*", metavar="MODEL", help="with `show`: only this model")
    configure.add_argument(
        "--context-size", type=int, metavar="N", help="context size in tokens (-1: maximum)"
    )
    configure.add_argument(
        "--keep-alive", metavar="DURATION", help="idle time before unloading: 5m, 1h, 0, -1"
    )
    configure.add_argument("--mode", choices=["completion", "embedding", "reranking", "image-generation"])
    configure.add_argument(
        "--think", nargs="?", const=True, type=_parse_bool, metavar="BOOL", help="reasoning on or off"
    )
    configure.add_argument(
        "--kv-persist",
        nargs="?",
        const=True,
        type=_parse_bool,
        metavar="BOOL",
        help="keep the prompt cache across unloads and restarts (llama.cpp; on by default)",
    )
    configure.add_argument(
        "--draft-from-context",
        type=_draft_type,
        metavar="TYPE",
        help="llama.cpp: speculative decoding with drafts from the conversation itself, which speeds up"
        " answers that copy it (file edits); TYPE: true (ngram-mod), ngram-mod, ngram-simple, ngram-map-k,"
        " or false (off). Greedy answers may differ where two tokens nearly tie",
    )
    configure.add_argument("--hf_overrides", "--hf-overrides", metavar="JSON", help="vLLM hf_overrides")
    configure.add_argument("--gpu-memory-utilization", type=float, metavar="F", help="vLLM, 0-1")
    configure.add_argument(
        "--speculative-draft-model",
        metavar="MODEL",
        help='speculative decoding (llama.cpp): a small model with the same vocabulary; "" turns it off',
    )
    configure.add_argument(
        "--speculative-num-tokens", type=int, metavar="N", help="tokens the draft model proposes per step"
    )
    configure.add_argument(
        "--speculative-min-acceptance-rate",
        type=float,
        metavar="F",
        help="minimum draft probability (0-1) for a drafted token to be proposed",
    )
    configure.add_argument(
        "--tensor-parallel-size", type=int, metavar="N", help="vLLM: split each layer over N workers"
    )
    configure.add_argument(
        "--pipeline-parallel-size", type=int, metavar="M", help="vLLM: split the layers into M stages"
    )
    configure.add_argument(
        "--ray-address",
        metavar="HOST:PORT",
        help='vLLM: run the workers on this Ray cluster (its head; "" = MODEL_RUNNER_RAY_ADDRESS or none)',
    )
    configure.add_argument(
        "--rpc",
        metavar="HOST:PORT[,...]",
        help='llama.cpp: spread the layers over these RPC workers (`model worker`); "" turns them off',
    )
    configure.add_argument("--backend", help="engine the settings are for")
    configure.set_defaults(handler=cmd_configure, accepts_passthrough=True)

    logs = commands.add_parser("logs", help="Show the daemon's and engines' logs.")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    logs.add_argument("--no-engines", action="store_true", help="only the daemon's log")
    logs.add_argument("--model", metavar="MODEL", help="only the lines about this model, and its engine logs")
    logs.set_defaults(handler=cmd_logs)
