"""`captain-ros transport receive|ship`: a receiver writing into the trainer's store (captain_ros.bridge.receiver) or
a shipper streaming a rollout host's store to it (captain_ros.bridge.shipper), over the ZeroMQ protocol of
captain_ros.bridge.wire.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import fields, replace
from pathlib import Path

from captain_ros.bridge.receiver import Receiver
from captain_ros.bridge.shipper import Shipper
from captain_ros.bridge.store import StoreError
from captain_ros.bridge.wire import TransportConfig, TransportError


def _config_from(args: argparse.Namespace, endpoint: str) -> TransportConfig:
    overrides = {
        f.name: getattr(args, f.name) for f in fields(TransportConfig) if getattr(args, f.name, None) is not None
    }
    return replace(TransportConfig(), **overrides, endpoint=endpoint)


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM or SIGINT (a clean stop); the previous handlers are restored afterwards."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="captain-ros transport",
        description="Ship episode records from a rollout host's store to the trainer's store over ZeroMQ.",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG logs every record")
    sub = parser.add_subparsers(dest="command", required=True)
    receive = sub.add_parser("receive", help="serve a receiver that writes into --store until SIGTERM")
    receive.add_argument("--store", required=True, type=Path, help="the trainer's episode store (SQLite file)")
    receive.add_argument("--bind", default=TransportConfig.endpoint, help="endpoint to listen on (loopback default)")
    receive.add_argument("--allow-remote", action="store_true", default=None, help="allow a non-loopback --bind")
    ship = sub.add_parser("ship", help="stream --store's unacknowledged records to a receiver")
    ship.add_argument("--store", required=True, type=Path, help="the rollout host's episode store (the outbox)")
    ship.add_argument("--connect", default=TransportConfig.endpoint, help="the receiver's endpoint")
    ship.add_argument("--until-idle", action="store_true", help="exit once everything is acknowledged")
    ship.add_argument("--timeout-s", type=float, default=600.0, help="with --until-idle: give up after this long")
    ship.add_argument("--window", type=int, help="most messages in flight without an ack")
    ship.add_argument("--ack-timeout-s", type=float, help="resend a message unacknowledged this long")
    ship.add_argument("--backoff-max-s", type=float, help="longest wait between retries of a full store")
    ship.add_argument("--name", help="shipper name in logs")
    for p in (receive, ship):
        p.add_argument("--hwm", type=int, help="ZeroMQ high-water marks, in messages")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        with _stop_on_signals() as stop:
            return _receive(args, stop) if args.command == "receive" else _ship(args, stop)
    except (ValueError, TransportError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _receive(args: argparse.Namespace, stop: threading.Event) -> int:
    with Receiver(args.store, _config_from(args, args.bind)) as receiver:
        stats = receiver.serve(stop)
    print(json.dumps({"command": "receive", "store": str(args.store), "endpoint": receiver.endpoint, **stats}))
    return 0


def _ship(args: argparse.Namespace, stop: threading.Event) -> int:
    with Shipper(args.store, _config_from(args, args.connect)) as shipper:
        stats = shipper.run(stop, until_idle=args.until_idle, timeout_s=args.timeout_s if args.until_idle else None)
    print(json.dumps({"command": "ship", "store": str(args.store), "endpoint": args.connect, **stats}))
    if args.until_idle and not stats["idle"] and not stop.is_set():
        print(
            f"error: not everything was acknowledged within {args.timeout_s} s: {stats['in_flight']} in flight",
            file=sys.stderr,
        )
        return 1
    if stats["parked"]:
        print(f"error: the receiver refused {stats['parked']} item(s) for good; see the log above", file=sys.stderr)
        return 1
    return 0
