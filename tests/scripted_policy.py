"""A scripted OpenAI-compatible policy server for DDS tests of the agent node: a stand-in for the language
model (tests/captain_ros/agent/test_agent_vllm.py runs an episode against real vLLM)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ScriptedPolicy:
    """Answers chat completions with the cells of `script(request_number)` (1-based over the server's
    lifetime) as `python` tool calls; `asked[n]` is set when request n arrives. With `per_episode`, the cells of
    `script(episode, request)`, both 1-based, the request counted in the conversation it continues (its assistant
    turns): what an episode is sent does not depend on how many requests an earlier one used."""

    def __init__(self, script, per_episode: bool = False):
        self.script, self.count, self.lock = script, 0, threading.Lock()
        self.per_episode, self.episodes = per_episode, 0
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
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                k = 1 + sum(m.get("role") == "assistant" for m in body.get("messages", []))
                with owner.lock:
                    owner.count += 1
                    owner.episodes += k == 1
                    n, episode = owner.count, owner.episodes
                code = owner.script(episode, k) if owner.per_episode else owner.script(n)
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
