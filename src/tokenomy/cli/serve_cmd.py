"""``tokenomy serve``: the token-operations gateway (docs/gateway.md)."""

from __future__ import annotations

import argparse
import logging


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the OpenAI-compatible gateway in front of the configured backends")
    p.add_argument("--config", default=None, help="gateway.yaml (default: front `tokenomy up`'s 4 emulators)")
    p.add_argument("--host", default=None, help="override server.host")
    p.add_argument("--port", type=int, default=None, help="override server.port")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from tokenomy.gateway.config import load_config
    from tokenomy.gateway.http.app import build_app

    config = load_config(args.config)
    server = config.server
    updates = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if updates:
        if "port" in updates and not 0 <= updates["port"] <= 65535:
            raise ValueError(f"--port must be in [0, 65535], got {updates['port']}")
        server = server.model_copy(update=updates)
        config = config.model_copy(update={"server": server})
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health check otherwise
    app = build_app(config)
    backends = ", ".join(f"{b.id}={b.url}" for b in config.backends)
    print(f"tokenomy gateway on http://{server.host}:{server.port} -> {backends} (router {config.router.name})",
          flush=True)
    uvicorn.run(app, host=server.host, port=server.port, loop="uvloop", http="httptools",
                log_level="warning", access_log=False, timeout_graceful_shutdown=5,
                proxy_headers=False, server_header=False)  # neither is read; each costs a request CPU
    return 0
