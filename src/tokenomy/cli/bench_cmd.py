"""``tokenomy bench``: replay a workload's sessions against an OpenAI-compatible endpoint (chat,
completions, Responses) or an Anthropic Messages one, and report the same metrics as ``tokenomy sim``
(docs/bench.md)."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tokenomy.bench import BenchConfig, BenchReport, PromptSizing, TurnResult, run_bench
from tokenomy.bench.config import APIS
from tokenomy.bench.plot import plot_timeline
from tokenomy.bench.sizing import FileTokenizer, measure_sizing, probe_remote
from tokenomy.cli.common import CLIError
from tokenomy.core import SLO, Session
from tokenomy.metrics.report import render_table, write_json
from tokenomy.policy.closedloop.retry import RetryPolicy
from tokenomy.workload.registry import SYNTHETIC, load_workload

SESSIONS_PER_STREAM = 20
"""Concurrency mode draws this many synthetic sessions per concurrent stream unless
``--max-sessions`` says otherwise (enough that streams rarely run dry before ``--duration``)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="agentic load on an OpenAI-compatible endpoint", description=__doc__)
    p.add_argument("--target", action="append", required=True,
                   help="endpoint base URL (http://host:port or .../v1); repeat or comma-separate for several")
    g = p.add_argument_group("workload")
    g.add_argument("--workload", default="gaia", help="chat | gaia | toolbench | path to a trace or session file")
    g.add_argument("--rate", type=float, default=None,
                   help="session arrivals per second (default 1; traces: 0 keeps the trace's clock)")
    g.add_argument("--concurrency", type=int, default=None,
                   help="keep this many sessions in flight instead of arrivals at --rate")
    g.add_argument("--duration", type=float, default=120.0,
                   help="seconds of arrivals (rate mode) or of sending (concurrency mode)")
    g.add_argument("--arrival", default="poisson", help="poisson | gamma")
    g.add_argument("--arrival-cv", type=float, default=1.0)
    g.add_argument("--max-sessions", type=int, default=None, help="cap on sessions taken from the workload")
    g.add_argument("--seed", type=int, default=0, help="workload and prompt-text seed")
    g.add_argument("--tenants", default=None, metavar="MIX",
                   help="give sessions without a tenant one drawn from a tier mix, e.g. gold:0.2,silver:0.3,free:0.5")
    r = p.add_argument_group("requests")
    r.add_argument("--model", default=None, help="model name to send (default: the target's first /v1/models entry)")
    r.add_argument("--api-key", default=None, help="API key (default: $OPENAI_API_KEY if set; --api messages: $ANTHROPIC_API_KEY first)")
    r.add_argument("--tenant-keys", type=Path, default=None, metavar="FILE",
                   help="YAML/JSON mapping tenant -> API key: each session sends its tenant's key "
                        "(tenants not listed send --api-key)")
    api = r.add_mutually_exclusive_group()
    api.add_argument("--api", choices=APIS, default=None,
                     help="chat: /v1/chat/completions (default); completions: /v1/completions with the conversation "
                          "as one prompt; messages: Anthropic /v1/messages; responses: OpenAI /v1/responses")
    api.add_argument("--chat", dest="api", action="store_const", const="chat", help="the same as --api chat")
    api.add_argument("--completions", dest="api", action="store_const", const="completions",
                     help="the same as --api completions")
    r.add_argument("--no-tool-calls", action="store_true",
                   help="messages/responses: re-send earlier answers as plain text and new input as user messages, "
                        "not as tool calls and their results (for conversations that are not agent loops)")
    r.add_argument("--no-ignore-eos", action="store_true",
                   help="do not send ignore_eos (answers may end before the workload's output length)")
    r.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for any one read of a response")
    r.add_argument("--max-retries", type=int, default=RetryPolicy.max_retries, metavar="N",
                   help="send a refused request (429, 503) again after its retry-after, up to N times, before "
                        "the session is abandoned (default %(default)s: the OpenAI SDK's; 0: a refusal ends it)")
    r.add_argument("--tokenizer", default="auto", metavar="auto|none|PATH",
                   help="size prompts in the target's tokens: auto (the target's POST /tokenize when it serves one, "
                        "else built-in), none (built-in: one token per filler word), or a tokenizer.json "
                        "(completions exact; chat template tokens unknown) (default: auto)")
    s = p.add_argument_group("SLO and cost")
    s.add_argument("--slo-ttft", type=float, default=SLO().ttft_s, help="TTFT bound, seconds")
    s.add_argument("--slo-tpot", type=float, default=SLO().tpot_s, help="TPOT bound, seconds (vLLM definition)")
    s.add_argument("--gpus", type=int, default=1, help="GPUs behind the target (cost and per-GPU goodput)")
    s.add_argument("--usd-per-gpu-hour", type=float, default=0.0)
    o = p.add_argument_group("output")
    o.add_argument("--name", default="bench", help="deployment name in the table and JSON")
    o.add_argument("--json", type=Path, default=None, help="write results as JSON here (sim --json's shape)")
    o.add_argument("--plot", type=Path, default=None, help="write a TTFT/TPOT timeline (PNG) here")
    o.add_argument("--html", type=Path, default=None,
                   help="write a self-contained HTML report (table, latency, token-class and per-session cost plots)")
    o.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run_bench_cmd)


def load_sessions(args: argparse.Namespace) -> list[Session]:
    """The workload's sessions. Concurrency mode ignores start times; for synthetic workloads it
    draws ``--max-sessions`` (default ``SESSIONS_PER_STREAM`` x concurrency) sessions."""
    if args.concurrency is not None and args.workload in SYNTHETIC:
        n = args.max_sessions or SESSIONS_PER_STREAM * args.concurrency
        sessions = load_workload(args.workload, rate_per_s=1.0, duration_s=2.0 * n + 10,
                                 seed=args.seed, max_sessions=n, tenants=args.tenants)
    else:
        default_rate = 0.0 if args.workload not in SYNTHETIC else 1.0
        rate = default_rate if args.rate is None else args.rate
        duration = math.inf if args.concurrency is not None else args.duration
        sessions = load_workload(args.workload, rate_per_s=rate, duration_s=duration, seed=args.seed,
                                 arrival=args.arrival, arrival_cv=args.arrival_cv, max_sessions=args.max_sessions,
                                 tenants=args.tenants)
    if not sessions:
        raise CLIError(f"--workload {args.workload!r} produced no sessions (check --rate and --duration)")
    return sessions


def _targets(raw: list[str]) -> tuple[str, ...]:
    return tuple(t for item in raw for t in item.split(",") if t.strip())


def discover_model(target: str, api_key: str | None, timeout_s: float = 10.0) -> str:
    """The first model id ``GET /v1/models`` lists; CLIError when the target cannot say."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.get(f"{target}/v1/models", headers=headers, timeout=timeout_s)
        resp.raise_for_status()
        return str(resp.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise CLIError(f"--model not given and {target}/v1/models did not name one ({exc}); pass --model") from None


BENCH_SCHEMA = "tokenomy.bench/1"
"""``tokenomy bench --json``: ``tokenomy.sim/2``'s top-level keys, with the bench settings as ``spec``."""


def read_tenant_keys(path: Path | None) -> tuple[tuple[str, str], ...]:
    """``--tenant-keys FILE``: a YAML (or JSON) mapping of tenant names to API keys."""
    if path is None:
        return ()
    import yaml

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CLIError(f"--tenant-keys {path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise CLIError(f"--tenant-keys {path}: not YAML/JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, dict) or not raw or not all(isinstance(k, str) and isinstance(v, str) and k and v
                                                       for k, v in raw.items()):
        raise CLIError(f"--tenant-keys {path}: expected a mapping of tenant names to API keys (strings)")
    return tuple(sorted(raw.items()))


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    api = args.api or "chat"
    env_keys = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY") if api == "messages" else ("OPENAI_API_KEY",)
    api_key = args.api_key if args.api_key is not None else next(
        (v for v in map(os.environ.get, env_keys) if v), None)
    targets = _targets(args.target)
    probe = BenchConfig(targets=targets, model=args.model or "-", concurrency=args.concurrency)
    tenant_keys = read_tenant_keys(args.tenant_keys)
    model = args.model or discover_model(probe.targets[0], api_key or (tenant_keys[0][1] if tenant_keys else None))
    return BenchConfig(
        targets=targets, model=model, api=api, api_key=api_key, concurrency=args.concurrency,
        duration_s=args.duration, request_timeout_s=args.timeout, ignore_eos=not args.no_ignore_eos,
        slo=SLO(ttft_s=args.slo_ttft, tpot_s=args.slo_tpot), gpus=args.gpus,
        usd_per_gpu_hour=args.usd_per_gpu_hour, seed=args.seed, tenant_keys=tenant_keys,
        retry=RetryPolicy(max_retries=args.max_retries), tool_calls=not args.no_tool_calls,
    )


def _check_args(args: argparse.Namespace) -> None:
    if args.concurrency is not None and args.concurrency < 1:
        raise CLIError(f"--concurrency must be >= 1, got {args.concurrency}")
    if args.concurrency is not None and args.rate is not None:
        raise CLIError("give --rate or --concurrency, not both")
    if not args.duration > 0:
        raise CLIError(f"--duration must be positive, got {args.duration}")
    if args.max_retries < 0:
        raise CLIError(f"--max-retries must be >= 0, got {args.max_retries}")


def run_bench_cmd(args: argparse.Namespace) -> int:
    console = Console()
    _check_args(args)
    config = config_from_args(args)
    sessions = load_sessions(args)
    n_turns = sum(len(s.turns) for s in sessions)
    mode = f"concurrency {config.concurrency}" if config.concurrency else f"arrivals from {args.workload}"
    console.print(f"bench [bold]{args.workload}[/]: {len(sessions)} sessions, {n_turns} turns, {mode}, "
                  f"{config.api} API, model {config.model} -> {', '.join(config.targets)}")
    sizing = prompt_sizing(args.tokenizer, config, console)
    result = _run_with_progress(sessions, config, n_turns, args.quiet, sizing)
    workload = {"source": args.workload, "sessions": len(sessions), "turns": n_turns}
    _print_and_write(result, config, args, console, workload)
    return 0


def _sized_as(api: str) -> str:
    """Messages and Responses reach the model through its chat template: they are sized as chat."""
    return "completions" if api == "completions" else "chat"


def prompt_sizing(choice: str, config: BenchConfig, console: Console) -> PromptSizing:
    """The sizing ``--tokenizer`` asks for, measured on the first target (docs/bench.md)."""
    if choice == "none":
        return PromptSizing()
    if choice != "auto":
        try:
            return measure_sizing(FileTokenizer(choice), _sized_as(config.api), seed=config.seed)
        except ValueError as exc:
            raise CLIError(str(exc)) from None
    tok = probe_remote(config.targets[0], model=config.model, api_key=config.api_key)
    if tok is None:
        console.print(f"prompt sizing: {config.targets[0]} serves no POST /tokenize; built-in (one token per "
                      "filler word); give --tokenizer PATH to size prompts for this model")
        return PromptSizing()
    try:
        sizing = measure_sizing(tok, _sized_as(config.api), seed=config.seed)
    except ValueError as exc:
        console.print(f"prompt sizing: {exc}; built-in instead")
        return PromptSizing()
    finally:
        tok.close()
    console.print(f"prompt sizing: {sizing.source}, {sizing.prompt_overhead_tokens} tokens added per prompt"
                  + (f", per message {sizing.message_overhead_tokens}" if sizing.message_overhead_tokens else ""))
    return sizing


def _run_with_progress(sessions: list[Session], config: BenchConfig, n_turns: int, quiet: bool,
                       sizing: PromptSizing) -> BenchReport:
    if quiet:
        return run_bench(sessions, config, sizing=sizing)
    errors = 0
    with Progress(TextColumn("[bold]bench[/]"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("turns  errors {task.fields[errors]}"), TimeElapsedColumn(),
                  transient=True) as bar:
        task = bar.add_task("bench", total=n_turns, errors=0)

        def on_result(r: TurnResult) -> None:
            nonlocal errors
            errors += 0 if r.outcome.ok else 1
            bar.update(task, advance=1, errors=errors)

        return run_bench(sessions, config, on_result=on_result, sizing=sizing)


def _print_and_write(
    result: BenchReport, config: BenchConfig, args: argparse.Namespace, console: Console, workload: dict[str, Any]
) -> None:
    title = f"{args.workload} -> {', '.join(config.targets)}"
    table = render_table({args.name: result.summary}, console=console, title=title)
    ex = result.extras
    frac = ex["cached_fraction"]
    err = ex["prompt_tokens_mean_abs_rel_error"]
    console.print(f"cached-token fraction: {'-' if frac is None else f'{frac:.1%}'}   "
                  f"prompt tokens sent/workload: {ex['prompt_tokens_sent']:,}/{ex['prompt_tokens_workload']:,}"
                  f" (mean |error| {'-' if err is None else f'{err:.1%}'})   "
                  f"errors by status: {result.errors_by_status or 'none'}")
    if args.json:
        settings = {"targets": list(config.targets), "model": config.model, "api": config.api,
                    "workload": args.workload, "concurrency": config.concurrency, "rate": args.rate,
                    "duration_s": config.duration_s, "max_sessions": args.max_sessions, "seed": config.seed,
                    "ignore_eos": config.ignore_eos, "tool_calls": config.tool_calls, "tokenizer": args.tokenizer, "tenants": args.tenants,
                    "tenant_keys": sorted(t for t, _ in config.tenant_keys)}  # names only: keys are secrets
        payload: dict[str, Any] = {
            "schema": BENCH_SCHEMA,
            "spec": settings,  # the settings that made this run, as `tokenomy sim --json` embeds its spec
            "workload": workload,
            "slo": {"ttft_s": config.slo.ttft_s, "tpot_s": config.slo.tpot_s},
            # split: the target's P:D layout is not known from outside; rate: the offered session rate
            "deployments": {args.name: {**result.payload(), "split": None, "rate_per_s": args.rate}},
            "bench": settings,
        }
        write_json(args.json, payload)
        console.print(f"wrote {args.json}")
    if args.plot:
        plot_timeline(result.records, config.slo, args.plot)
        console.print(f"wrote {args.plot}")
    if args.html:
        from tokenomy.cli.html_out import write_bench_html
        from tokenomy.gateway.config import DEFAULT_PRICE
        from tokenomy.metrics.html_figures import TokenPrices

        prices = TokenPrices(DEFAULT_PRICE.input_per_mtok, DEFAULT_PRICE.cached_input_per_mtok,
                             DEFAULT_PRICE.output_per_mtok)
        write_bench_html(args.html, title, table, args.name, result.summary, result.records, config.slo, prices)
        console.print(f"wrote {args.html}")


__all__ = ["config_from_args", "load_sessions", "register", "run_bench_cmd"]
