"""`captain-ros expert-server` (also the `expert_server` console script launch files start): the scripted expert as an
OpenAI-compatible policy server on --host:--port (captain_ros.agent.expert_server); prints "READY <url>" when
listening, serves until interrupted."""

from __future__ import annotations

import argparse

from captain_ros.agent.expert_server import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="captain-ros expert-server", description="Serve the scripted expert as an OpenAI-compatible policy."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8001, help="port to listen on (0: any free port)")
    args = parser.parse_args(argv)
    server = serve(args.host, args.port)
    host, port = server.server_address[:2]
    print(f"READY http://{host}:{port}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
