"""A scripted OpenAI-compatible policy server for DDS tests of the agent node: a stand-in for the language
model (tests/captain_ros/agent/test_agent_vllm.py runs an episode against real vLLM)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ScriptedPolicy:
    """Answers chat completions with the cells of `script(request_number)` (1-based over the server's
    lifetime) as `python` tool calls; `asked[n]` is set when request n arrives."""

    def __init__(self, script):
        self.script, self.count, self.lock = script, 0, threading.Lock()
        self.asked = [threading.Event() for _ in range(64)]
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _json(self, payload: dict) -> None:
                body = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._json({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

            def do_POST(self):
                json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with owner.lock:
                    owner.count += 1
                    n = owner.count
                code = owner.script(n)
                owner.asked[min(n, 63)].set()
                call = {
                    "id": f"call-{n}",
                    "type": "function",
                    "function": {"name": "python", "arguments": json.dumps({"code": code})},
                }
                message = {"role": "assistant", "content": f"step {n}", "tool_calls": [call]}
                self._json(
                    {
                        "id": f"chat-{n}",
                        "object": "chat.completion",
                        "model": "scripted",
                        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                )

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
