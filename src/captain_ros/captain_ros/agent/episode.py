"""The episode loop (CaPtain §3.1, Appendix A.1; ARCHITECTURE.md "Episode loop").

One request = one chat completion with the same task context and the single tool `python`; each tool
call's code runs as a cell in the episode's sandboxed Python session, whose `robot` calls come back
here over a pipe and go to the harness through a `HarnessLink`. Budgets (requests, physical actions,
wall time on the episode's clock) end the episode; `finish(note)` goes through the harness's
completion gate. Outcomes follow CaPtain Eq. 7's classes; infrastructure failures (policy server
down, simulator fault, the sandbox unable to start, a lost ROS link) are never task outcomes.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from captain_ros.agent.context import Context, Turn, cut_text, image_part
from captain_ros.agent.link import HarnessLink, LinkError
from captain_ros.agent.policy_client import unread_feedback, unread_tool_call
from captain_ros.agent.prompt import SYSTEM_PROMPT, TOOLS, parameters, task_md
from captain_ros.agent.sandbox import SandboxError, remove_scratch
from captain_ros.agent.transcript import Transcript
from captain_ros.core.config import HarnessConfig
from captain_ros.core.contract import CAPABILITY_BY_NAME, PHYSICAL_CAPABILITIES, Budget, FailureCategory

logger = logging.getLogger(__name__)
# Calls that cost the host compute and memory but no physical action: rate-limited per request.
SENSING_CAPABILITIES = frozenset(
    c.name for c in CAPABILITY_BY_NAME.values() if c.group in ("perception", "measurement")
)


class Outcome(StrEnum):
    """Episode outcome classes (CaPtain Eq. 7); the values match captain_interfaces/EpisodeStatus."""

    SUCCESS = "success"  # strict success: the host's predicate holds and finish() was accepted
    FALSE_FINISH = "false_finish"  # finish() accepted on a scene that fails the predicate
    MISSED_FINISH = "missed_finish"  # solved, but no finish (held for N requests, or the budget ran out)
    BUDGET_EXHAUSTED = "budget_exhausted"  # not solved when a budget ran out
    FAILURE = "failure"  # not solved, no finish, no budget spent (e.g. the policy had nothing to say)
    INFRASTRUCTURE = "infrastructure_failure"  # never counted as a task outcome


class Policy(Protocol):
    def complete(self, messages: list[dict], tools: list[dict], headers: dict[str, str] | None = None) -> Any:
        """A Completion (captain_ros.agent.policy_client): content, tool_calls, token ids, latency_s. `headers`
        name the episode and request for a recording proxy (ignored by a plain server)."""


class Recorder(Protocol):
    """Sees an episode as it runs, for training records (captain_ros.bridge.recorder). A hook that raises
    ends the episode as an infrastructure failure: an episode whose record is broken is never a task outcome."""

    def started(self, start: Any) -> None: ...

    def before_request(self, index: int) -> None: ...

    def after_request(
        self, index: int, timing: RequestTiming, calls: list[dict], images: list[tuple], cells: list[dict]
    ) -> None: ...

    def ended(self, result: EpisodeResult) -> None: ...

    # Optional: `stop_early(index) -> str | None`, asked right after `before_request(index)`. A reason ends the
    # episode before request `index` is sent, settled as budget-exhausted (CaPtain App. E: the critic's early stop
    # of an RL rollout; captain_ros_training.early_stop). A recorder without it never stops an episode.


def error_line(error: str, limit: int = 200) -> str:
    """The last line of a traceback (`NameError: name 'x' is not defined`), or the first of another message."""
    lines = [line.strip() for line in (error or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1] if lines[0].startswith(("Traceback", 'File "')) else lines[0]  # a traceback ends in its error
    return line[:limit]


def request_headers(episode_id: str, index: int) -> dict[str, str]:
    """What the recording proxy attributes a model call by (its X-Captain-* headers: captain_ros.bridge.attribution)."""
    return {"X-Captain-Episode": episode_id, "X-Captain-Request": str(index)}


class PolicyFailure(Exception):
    """Raised by a policy when the server cannot answer (after its own retries)."""


@dataclass
class RequestTiming:
    index: int
    total_s: float
    generation_s: float
    physical_s: float

    @property
    def overhead_s(self) -> float:
        """Everything but model generation and the motions' own duration: sandbox, the robot calls'
        compute, rendering, prompt building."""
        return max(0.0, self.total_s - self.generation_s - self.physical_s)


@dataclass
class EpisodeResult:
    episode_id: str
    task: str
    start_id: str
    outcome: Outcome
    host_success: bool | None  # None: no scorer (real arm) or never scored (infrastructure failure)
    finished: bool
    requests: int
    actions: int
    wall_time_s: float
    reason: str  # why the episode ended, in words
    timings: list[RequestTiming] = field(default_factory=list)
    transcript_dir: str = ""
    sandbox_start_s: float = 0.0  # once per episode, before the first request

    @property
    def strict_success(self) -> bool:
        return self.outcome is Outcome.SUCCESS

    @property
    def valid(self) -> bool:
        return self.outcome is not Outcome.INFRASTRUCTURE

    def summary(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "timings"}
        d["outcome"], d["strict_success"] = self.outcome.value, self.strict_success
        d["overhead_s"] = [round(t.overhead_s, 4) for t in self.timings]
        d["generation_s"] = [round(t.generation_s, 4) for t in self.timings]
        return d


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def fenced_python(text: str) -> str | None:
    """The Python a reply holds in fenced code blocks (```python, ```py, or unlabelled when no block is labelled),
    joined in order; None when it has none with code in it."""
    blocks = [(label.lower(), code) for label, code in _FENCE.findall(text or "")]
    python = [code for label, code in blocks if label in ("python", "py", "python3")]
    chosen = python or [code for label, code in blocks if not label]
    code = "\n\n".join(block.strip("\n") for block in chosen)
    return code if code.strip() else None


def bind_arguments(capability: str, args: list, kwargs: dict) -> dict:
    """Positional arguments of a robot call bound to the capability's parameter names."""
    names = parameters().get(capability, ())
    if len(args) > len(names):
        raise TypeError(f"{capability}() takes at most {len(names)} positional arguments ({len(args)} given)")
    bound = dict(zip(names, args, strict=False))
    twice = sorted(set(bound) & set(kwargs))
    if twice:
        raise TypeError(f"{capability}() got multiple values for {', '.join(twice)}")
    return {**bound, **kwargs}


class _Cell:
    """What one cell did to the robot: its calls' results and receipts."""

    def __init__(self):
        self.calls: list[dict] = []
        self.receipts: list[str] = []
        self.observed: list[str] = []  # the handles of its successful observe() calls, the most recent last
        self.images: list[tuple[str, Any]] = []  # (label, rgb) of the most recent ones, fetched after the cell


class EpisodeRunner:
    """Runs episodes against a harness link with one policy. `sandbox_factory(scratch_dir, on_call,
    allowed)` returns a started session with `run_cell(code)` and `close()` (captain_ros.agent.sandbox).
    `clock`: the episode's clock (the ROS clock in the agent node: sim time with the twin). `on_event`
    receives (kind, data) for live displays and status topics."""

    def __init__(
        self,
        link: HarnessLink,
        policy: Policy,
        config: HarnessConfig,
        *,
        sandbox_factory: Callable[..., Any],
        runs_dir: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_event: Callable[[str, dict], None] | None = None,
        recorder: Recorder | None = None,
    ):
        self.link, self.policy, self.config = link, policy, config
        self.recorder = recorder
        self.sandbox_factory = sandbox_factory
        self.runs_dir = Path(runs_dir) if runs_dir else None
        self.clock = clock
        self.on_event = on_event or (lambda kind, data: None)

    # ------------------------------------------------------------------------------ one episode
    def run(self, task: str, start_id: str | None = None, split: str = "any", episode_id: str = "") -> EpisodeResult:
        episode_id = episode_id or uuid.uuid4().hex[:12]
        state = _Episode(self, episode_id)
        try:
            return state.run(task, start_id, split)
        finally:
            state.close()


class _Episode:
    def __init__(self, runner: EpisodeRunner, episode_id: str):
        self.r, self.episode_id = runner, episode_id
        self.cfg, self.budgets = runner.config.agent, runner.config.budgets
        self.link = runner.link
        self.requests = self.actions = 0
        self.finished = False
        self.infrastructure = ""  # set when an infrastructure failure ends the episode
        self.timings: list[RequestTiming] = []
        self.sandbox = None
        self.transcript: Transcript | None = None
        self.start = None
        self._cell: _Cell | None = None  # the cell running now (its robot calls land here)
        self._request_calls: list[dict] = []  # every robot call of the request running now
        self._request_images: list[tuple[str, dict]] = []  # (label, image part) shown after it
        self._request_cells: list[dict] = []  # each cell of the request: source, status, error line (step record)
        self._sensing_calls = 0  # perception and measurement calls of the request running now
        self.sandbox_start_s = 0.0
        self.t0 = runner.clock()
        self._scratch: Path | None = None

    def event(self, kind: str, **data: Any) -> None:
        self.r.on_event(kind, {"episode_id": self.episode_id, "budget": self.budget(), **data})

    def budget(self) -> Budget:
        b = self.budgets
        return Budget(
            requests_used=self.requests,
            requests_limit=b.requests,
            actions_used=self.actions,
            actions_limit=b.physical_actions,
            wall_time_used_s=self.r.clock() - self.t0,
            wall_time_limit_s=b.wall_time_s,
        )

    def budget_line(self) -> str:
        b = self.budget()
        return (
            f"[budget] requests {b.requests_used}/{b.requests_limit}, physical actions {b.actions_used}/"
            f"{b.actions_limit}, time {b.wall_time_used_s:.0f}/{b.wall_time_limit_s:.0f} s"
        )

    # ------------------------------------------------------------------------------ loop
    def run(self, task: str, start_id: str | None, split: str) -> EpisodeResult:  # noqa: PLR0911, PLR0912 - one exit per end
        try:
            self.start = self.link.reset(task, start_id, split, self.episode_id)
        except LinkError as exc:
            return self._end(Outcome.INFRASTRUCTURE, f"reset failed: {exc}", score=False)
        s = self.start
        if self.r.runs_dir is not None:
            self.transcript = Transcript(self.r.runs_dir / s.episode_id)
        self.t0 = self.r.clock()
        document = s.task_md or task_md(s.instruction, s.criteria, self.budgets)
        context = Context(SYSTEM_PROMPT, document, self.cfg, s.instruction)
        self.event("start", task=s.task, start_id=s.start_id, instruction=s.instruction)
        if not self._record("started", s):
            return self._end(Outcome.INFRASTRUCTURE, self.infrastructure, score=False)
        if self.transcript:
            self.transcript.start(s, SYSTEM_PROMPT, document, TOOLS, asdict(self.r.config.agent))
        try:
            t_sandbox = time.perf_counter()
            self._open_sandbox()
            self.sandbox_start_s = time.perf_counter() - t_sandbox
        except Exception as exc:
            return self._end(Outcome.INFRASTRUCTURE, f"the sandbox could not start: {exc}", score=False)

        held = 0  # consecutive requests with every goal holding and no finish
        while True:
            spent = self._spent()
            if spent:
                return self._end(None, f"the {spent} budget is spent")
            score = self._score()
            held = held + 1 if score is not None and score.success else 0
            if held >= self.cfg.missed_finish_requests:
                return self._end(Outcome.MISSED_FINISH, f"solved for {held} requests without finish: stopped")
            index = self.requests + 1
            if not self._record("before_request", index):
                return self._end(Outcome.INFRASTRUCTURE, self.infrastructure)
            stop = self._stop_early(index)
            if self.infrastructure:
                return self._end(Outcome.INFRASTRUCTURE, self.infrastructure)
            if stop:
                return self._end(Outcome.BUDGET_EXHAUSTED, f"stopped early before request {index}: {stop}")
            t_request = time.perf_counter()
            physical0 = self.link.physical_s
            if context.compact_if_needed():
                self.event("compacted", removed=len(context.compacted))
            messages = context.messages()
            try:
                completion = self.r.policy.complete(messages, TOOLS, headers=request_headers(self.episode_id, index))
            except Exception as exc:  # PolicyError and anything the client did not foresee
                return self._end(Outcome.INFRASTRUCTURE, f"policy server: {exc}")
            context.measured(messages, (getattr(completion, "usage", None) or {}).get("prompt_tokens"))
            self.requests = index
            self._request_calls, self._request_images, self._sensing_calls = [], [], 0
            self._request_cells = []
            self.link.note_request()
            turn = self._turn(completion)
            context.add(turn)
            timing = RequestTiming(
                self.requests,
                time.perf_counter() - t_request,
                float(getattr(completion, "latency_s", 0.0)),
                self.link.physical_s - physical0,
            )
            self.timings.append(timing)
            if self.transcript:
                self.transcript.request(self.requests, completion, turn, timing, self.budget_line())
            self._record("after_request", index, timing, self._request_calls, self._request_images, self._request_cells)
            if self.infrastructure:
                return self._end(Outcome.INFRASTRUCTURE, self.infrastructure)
            if self.finished:
                return self._end(None, "finish() accepted")
            attempted = turn.assistant.get("tool_calls") or turn.fenced_code or turn.unread_tool_call
            if not attempted and self.cfg.end_on_no_tool_call:
                return self._end(None, "the reply had no tool call: the episode ends")

    def _spent(self) -> str | None:
        b = self.budgets
        if self.requests >= b.requests:
            return "requests"
        if self.actions >= b.physical_actions:
            return "physical actions"
        if self.r.clock() - self.t0 >= b.wall_time_s:
            return "wall time"
        return None

    def _score(self):
        try:
            return self.link.score()
        except LinkError as exc:
            self.infrastructure = f"scoring failed: {exc}"
            return None

    # ------------------------------------------------------------------------------ one request
    def _turn(self, completion: Any) -> Turn:
        calls = list(getattr(completion, "tool_calls", None) or [])
        content = getattr(completion, "content", "") or ""
        assistant: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            assistant["tool_calls"] = calls
        turn = Turn(self.requests, assistant)
        self.event("reply", request=self.requests, content=content, tool_calls=len(calls))
        unread = "" if calls else unread_tool_call(content, getattr(completion, "finish_reason", "") or "")
        if unread:  # it tried to call the tool: say what was wrong, costing the request, instead of ending
            turn.unread_tool_call = unread
            self.event("unread_tool_call", request=self.requests, reason=unread)
            turn.replies.append({"role": "user", "content": unread_feedback(unread, self.budget_line())})
            return turn
        fenced = fenced_python(content) if not calls and self.cfg.accept_fenced_code else None
        if fenced is not None:  # a small local model that answers in a code block instead of a tool call
            turn.fenced_code = fenced
            text, cell = self._run(fenced, source="fenced")
            # its output comes back as a user message, the form a chat template renders after a plain reply
            turn.replies.append({"role": "user", "content": f"[output of your python block]\n{text}"})
            if cell is not None:
                turn.commands += [f"{c['capability']}: {c['receipt'] or c['message']}" for c in cell.calls]
                self._show_images(turn, cell.images)
            return turn
        if not calls:
            if self.cfg.end_on_no_tool_call:
                return turn  # the loop ends here
            turn.replies.append(
                {
                    "role": "user",
                    "content": "Your reply had no tool call, so nothing ran. Reply with one call of the `python` "
                    "tool holding a cell of code; call finish(note) in a cell when the task is done.\n"
                    + self.budget_line(),
                }
            )
            return turn
        images: list[tuple[str, Any]] = []
        for call in calls:
            text, cell = self._tool_call(call)
            turn.replies.append({"role": "tool", "tool_call_id": str(call.get("id", "")), "content": text})
            if cell is not None:
                turn.commands += [f"{c['capability']}: {c['receipt'] or c['message']}" for c in cell.calls]
                images += cell.images
            if self.finished or self.infrastructure:
                break
        self._show_images(turn, images)
        return turn

    def _show_images(self, turn: Turn, images: list[tuple[str, Any]]) -> None:
        """The request's images (its cells' most recent observations) as one user message after its replies."""
        if images and self.cfg.send_images:
            shown = images[-self.cfg.max_images_per_cell :]
            parts: list[dict] = [
                {"type": "text", "text": "Images from the cell: " + ", ".join(label for label, _ in shown)}
            ]
            image_parts = [image_part(rgb) for _, rgb in shown]
            self._request_images = [(label, part) for (label, _), part in zip(shown, image_parts, strict=True)]
            parts += image_parts
            turn.replies.append({"role": "user", "content": parts})

    def _tool_call(self, call: dict) -> tuple[str, _Cell | None]:
        """Run one tool call; returns the tool message text and what the cell did (None if nothing ran)."""
        function = call.get("function") or {}
        name, raw = function.get("name"), function.get("arguments")
        problem = ""
        if name != "python":
            problem = f'unknown tool {name!r}: the only tool is `python` with {{"code": ...}}'
        else:
            try:
                arguments = json.loads(raw) if isinstance(raw, str) else raw
            except json.JSONDecodeError as exc:
                arguments, problem = None, f'the tool arguments are not valid JSON ({exc}); send {{"code": "..."}}'
            code = arguments.get("code") if isinstance(arguments, dict) else None
            if not problem and (not isinstance(code, str) or not code.strip()):
                problem = "the python tool needs a non-empty string argument `code`"
        if problem:
            self._request_cells.append({"source": "tool_call", "status": "not_run", "error": problem})
            return f"[error] {problem}", None
        return self._run(code)

    def _run(self, code: str, source: str = "tool_call") -> tuple[str, _Cell | None]:
        """Run one cell; returns the text that goes back to the model and what the cell did (None: nothing ran).
        `source`: how the reply carried the cell (a tool call, or a fenced block), recorded with its status."""
        cell = _Cell()
        self._cell = cell
        self.event("cell", request=self.requests, code=code)
        try:
            result = self.sandbox.run_cell(code)
        except SandboxError as exc:  # the session could not be restarted: this episode ends, not the agent
            self.infrastructure = f"sandbox: {exc}"
            return f"[error] {self.infrastructure}", None
        finally:
            self._cell = None
        self._request_cells.append({"source": source, "status": result.status, "error": error_line(result.error)})
        if self.cfg.send_images:
            self._attach_images(cell)
        parts = [cut_text(result.output.rstrip(), round(self.cfg.tool_output_max_tokens * self.cfg.chars_per_token))]
        if cell.receipts:
            lines = cell.receipts[: self.cfg.max_receipt_lines]
            more = len(cell.receipts) - len(lines)
            parts.append("[receipts]\n" + "\n".join(lines) + (f"\n[... {more} more receipts cut]" if more else ""))
        if result.status != "ok":
            parts.append(f"[error] ({result.status})\n{cut_text(result.error, 3000)}")
        if result.restarted:
            parts.append(
                "[session] the Python session was restarted: variables and functions defined so far are lost "
                "(the robot is unaffected)."
            )
        parts.append(self.budget_line())
        text = "\n".join(p for p in parts if p)
        self.event("output", request=self.requests, status=result.status, text=text)
        return text, cell

    def _attach_images(self, cell: _Cell) -> None:
        """The images of the cell's most recent observations (at most `max_images_per_cell`, newest last)."""
        for handle in cell.observed:
            try:
                cell.images += [(f"{cam} ({handle})", rgb) for cam, rgb in self.link.images(handle)]
            except Exception as exc:
                cell.receipts.append(f"observe: the images of {handle} could not be attached: {exc}")
        del cell.images[: -self.cfg.max_images_per_cell]

    # ------------------------------------------------------------------------------ robot calls from the cell
    def on_call(self, name: str, args: list, kwargs: dict) -> dict:
        """A `robot.<name>(...)` call from the running cell. Never raises."""
        result = self._robot_call(name, args, kwargs)
        try:
            arguments = bind_arguments(name, list(args), dict(kwargs))
        except TypeError:  # refused above for this reason; keep what was sent
            arguments = {"args": list(args), **kwargs}
        self._request_calls.append({"arguments": arguments, **result})
        cell = self._cell
        if cell is not None:
            cell.calls.append(result)
            cell.receipts.append(
                result.get("receipt") or f"{name}: FAILED {result['failure_category']}: {result['message']}"
            )
            if name == "observe" and result.get("success"):
                cell.observed = [*cell.observed, (result.get("value") or {}).get("observation_handle")]
                del cell.observed[: -self.cfg.max_images_per_cell]  # nothing older can be shown
        # the episode's budget is the agent's (a harness node does not see requests, and its clock may differ)
        result["budget"] = asdict(self.budget())
        if self.transcript:
            self.transcript.call(self.requests, name, kwargs, result)
        return {k: v for k, v in result.items() if k not in ("capability", "receipt")}

    def _over_budget(self, name: str) -> str:
        """Why the call may not run now ("" when it may): physical actions per episode, perception and measurement
        calls per request (each costs the host compute and memory)."""
        if name in PHYSICAL_CAPABILITIES and self.actions >= self.budgets.physical_actions:
            return "the physical actions budget is spent"
        if name in SENSING_CAPABILITIES:
            self._sensing_calls += 1
            limit = self.budgets.perception_calls_per_request
            if limit and self._sensing_calls > limit:
                return (
                    f"at most {limit} perception and measurement calls per request: use what they returned, and "
                    "call again in the next request"
                )
        return ""

    def _robot_call(self, name: str, args: list, kwargs: dict) -> dict:
        if self.finished or self.infrastructure:
            why = "the episode is finished" if self.finished else "the episode was stopped (infrastructure fault)"
            return _refused(name, f"{why}: no further robot calls run")
        try:
            kwargs = bind_arguments(name, list(args), dict(kwargs))
        except TypeError as exc:
            return _refused(name, str(exc))
        over = self._over_budget(name)
        if over:
            return _refused(name, over, FailureCategory.BUDGET_EXHAUSTED)
        try:
            result = self.link.call(name, kwargs)
        except LinkError as exc:
            self.infrastructure = f"harness link lost during {name}: {exc}"
            return _refused(name, self.infrastructure, FailureCategory.BACKEND_ERROR)
        except Exception as exc:  # a bug on the host side must not reach the policy as a crash
            self.infrastructure = f"host error during {name}: {type(exc).__name__}: {exc}"
            return _refused(name, self.infrastructure, FailureCategory.BACKEND_ERROR, traceback.format_exc(limit=3))
        if name in PHYSICAL_CAPABILITIES and result.get("failure_category") not in (
            FailureCategory.INVALID_ARGUMENT.value,
            FailureCategory.BUDGET_EXHAUSTED.value,
        ):
            self.actions += 1  # counted once its arguments were valid, as the harness counts it
        if result.get("failure_category") == FailureCategory.BACKEND_ERROR.value:
            self.infrastructure = f"{name}: {result.get('message', '')}"
        if name == "finish" and result.get("success"):
            self.finished = True
        return result

    # ------------------------------------------------------------------------------ start and end
    def _open_sandbox(self) -> None:
        self._scratch = Path(tempfile.mkdtemp(prefix=f"captain-{self.episode_id}-"))
        allowed = [c for c in CAPABILITY_BY_NAME]
        self.sandbox = self.r.sandbox_factory(self._scratch, self.on_call, allowed)

    def _end(self, outcome: Outcome | None, reason: str, score: bool = True) -> EpisodeResult:
        host = None
        if score and outcome is not Outcome.INFRASTRUCTURE:
            try:
                self.link.settle(self.cfg.settle_s)
                verdict = self.link.score()
                host = None if verdict is None else verdict.success
            except LinkError as exc:
                outcome, reason = Outcome.INFRASTRUCTURE, f"{reason}; scoring failed: {exc}"
        if outcome is Outcome.MISSED_FINISH and host is False:  # it did not stay solved while settling
            outcome, reason = Outcome.FAILURE, reason + "; the scene was no longer solved after settling"
        if outcome is None:
            if self.finished:
                outcome = Outcome.FALSE_FINISH if host is False else Outcome.SUCCESS
            elif host:
                outcome = Outcome.MISSED_FINISH
            elif reason.endswith("budget is spent"):
                outcome = Outcome.BUDGET_EXHAUSTED
            else:
                outcome = Outcome.FAILURE
        s = self.start
        result = EpisodeResult(
            episode_id=s.episode_id if s else self.episode_id,
            task=s.task if s else "",
            start_id=s.start_id if s else "",
            outcome=outcome,
            host_success=host,
            finished=self.finished,
            requests=self.requests,
            actions=self.actions,
            wall_time_s=round(self.r.clock() - self.t0, 3),
            reason=reason,
            timings=self.timings,
            sandbox_start_s=round(self.sandbox_start_s, 3),
            transcript_dir=str(self.transcript.folder) if self.transcript else "",
        )
        if self.transcript:
            self.transcript.end(result.summary())
        self._record("ended", result)
        self.event("end", result=result)
        return result

    def _stop_early(self, index: int) -> str | None:
        """The recorder's early-stop verdict before request `index` (None: go on); a failing hook is an
        infrastructure failure, as any recorder hook's."""
        hook = getattr(self.r.recorder, "stop_early", None)
        if hook is None:
            return None
        try:
            return hook(index)
        except Exception as exc:
            self.infrastructure = f"recording failed (stop_early): {type(exc).__name__}: {exc}"
            return None

    def _record(self, hook: str, *args: Any) -> bool:
        """Call the recorder's hook; a failure makes the episode an infrastructure failure (False)."""
        if self.r.recorder is None:
            return True
        try:
            getattr(self.r.recorder, hook)(*args)
            return True
        except Exception as exc:
            if not self.infrastructure:
                self.infrastructure = f"recording failed ({hook}): {type(exc).__name__}: {exc}"
            return False

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
        if self._scratch is not None:  # after the session is gone: nothing writes there any more
            try:
                remove_scratch(self._scratch)
            except OSError as exc:
                logger.warning("episode %s: its scratch folder was not removed: %s", self.episode_id, exc)


def _refused(
    name: str, message: str, category: FailureCategory = FailureCategory.INVALID_ARGUMENT, detail: str = ""
) -> dict:
    """A robot call the agent answered itself (nothing reached the harness)."""
    return {
        "success": False,
        "executed": False,
        "failure_category": category.value,
        "message": message,
        "value": None,
        "diagnostics": {"traceback": detail} if detail else {},
        "budget": {},
        "capability": name,
        "receipt": f"{name}: FAILED {category.value}: {message}"[:300],
    }
