"""`captain-ros proxy --upstream URL --store S`: the recording proxy (captain_ros.bridge.proxy) as a process; prints
"READY <url>" when listening, serves until SIGTERM or Ctrl-C, then closes the store cleanly."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from dataclasses import asdict
from pathlib import Path

from captain_ros.bridge.proxy import ProxyConfig, log, serve
from captain_ros.bridge.store import StoreError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="captain-ros proxy",
        description="Record every chat completion between the agent and an OpenAI-compatible server.",
    )
    defaults = ProxyConfig()
    parser.add_argument("--upstream", required=True, help="the upstream's OpenAI API root, e.g. http://host:8000/v1")
    parser.add_argument("--store", required=True, type=Path, help="the episode store file (created if missing)")
    parser.add_argument("--host", default=defaults.host, help="address to listen on")
    parser.add_argument("--port", type=int, default=defaults.port, help="port to listen on (0: any free port)")
    parser.add_argument("--policy-version", type=int, default=0, help="policy version recorded until changed")
    parser.add_argument("--require-episode", action="store_true", help="refuse requests without X-Captain headers")
    parser.add_argument(
        "--allow-missing-token-ids",
        action="store_true",
        help="record replies without token ids/logprobs (servers that are not language models) instead of a 502",
    )
    parser.add_argument("--upstream-timeout-s", type=float, default=defaults.upstream_timeout_s)
    parser.add_argument("--connect-timeout-s", type=float, default=defaults.connect_timeout_s)
    parser.add_argument("--verbose", action="store_true", help="also log every HTTP request line")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.policy_version < 0:
        parser.error("--policy-version must be >= 0")
    config = ProxyConfig(
        upstream_url=args.upstream,
        store_path=str(args.store),
        host=args.host,
        port=args.port,
        policy_version=args.policy_version,
        require_episode=args.require_episode,
        require_token_ids=not args.allow_missing_token_ids,
        upstream_timeout_s=args.upstream_timeout_s,
        connect_timeout_s=args.connect_timeout_s,
    )
    try:
        proxy, server = serve(config)
    except (OSError, StoreError) as exc:
        print(f"cannot start the recording proxy: {exc}", file=sys.stderr)
        return 1
    host, port = server.server_address[:2]

    def _terminate(*_: object) -> None:
        raise KeyboardInterrupt  # SIGTERM stops serving the same way as Ctrl-C: the store is closed cleanly

    signal.signal(signal.SIGTERM, _terminate)
    log.info("recording %s into %s (config %s)", config.upstream_url, config.store_path, asdict(config))
    print(f"READY http://{host}:{port}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        proxy.close()
    return 0
