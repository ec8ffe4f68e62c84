"""Property-based fuzzing of every capability on the harness core (twin backend, in-process).

Hypothesis sends every capability of the contract and unknown or garbage names, with arguments of random
shapes and types: valid and out-of-range values, NaN and infinities (as numbers and as strings), huge
numbers, nested lists, unknown and missing keyword arguments, unknown observation handles and detection
ids. Every answer must be in the contract (success, or a failure category of the closed set with a clear
message, never a crash), with a receipt within its limit and a JSON-safe value; nothing moves unless the
result says `executed`; only physical actions count against the action budget. After each sequence the
completion gate still reads the log, and an honest ending (a small move, a check, finish) is accepted.

The strategies are shared with the same fuzzing over DDS (tests/captain_ros/ros/test_fuzz_dds.py). Valid arguments of
physical actions stay in a small box above the table at speeds that keep every motion short, so a run is
bounded; invalid ones may be anything. Placeholders like "<det>" stand for the ids the calls before
produced (the newest detection, observation handle, ...), so valid sequences reach deep into perception.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, currently_in_test_context, event, example, given, settings
from hypothesis import strategies as st

from captain_ros.core import robot
from captain_ros.core.config import load_config
from captain_ros.core.contract import (
    CAPABILITIES,
    CAPABILITY_BY_NAME,
    PHYSICAL_CAPABILITIES,
    RECEIPT_MAX_CHARS,
    FailureCategory,
)
from captain_ros.harness.harness import Harness, policy_frames
from captain_ros.harness.twin_backend import TwinBackend
from captain_ros.perception.geometry import SHAPES
from captain_ros.perception.perception import CAMERAS, GRANULARITIES
from captain_ros.twin.sim import Twin

pytestmark = pytest.mark.slow
TASK = "put_red_cube_in_bowl"
START = f"{TASK}/official/0"
NAMES = tuple(c.name for c in CAPABILITIES)
CATEGORIES = {c.value for c in FailureCategory}
SAFETY = load_config().safety

# ------------------------------------------------------------------------------ values of any kind
NASTY = (
    "NaN",
    "nan",
    "inf",
    "-Infinity",
    "1e999",
    "",
    " ",
    "\x00",
    "0x10",
    "null",
    "det-1",
    "obs-1",
    "🤖" * 40,
    "\udc00",  # a lone surrogate: valid in JSON ("\\udc00"), not encodable as UTF-8 on the wire
    "red cube \ud800",
    "x" * 2000,
    10**400,
    -(10**400),
    2**63,
    -(2**64),
    1e308,
    -1e308,
    5e-324,
    -0.0,
    math.nan,
    math.inf,
    -math.inf,
    [],
    {},
    [[]],
    [None],
    [math.nan, math.nan, math.nan],
    [[[[[1]]]]],
    True,
    False,
    None,
)
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12))
JSON_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)
ANY = st.one_of(st.sampled_from(NASTY), JSON_VALUES)
# anything but a number: where a valid number could make a motion long (durations, speeds, poses)
NOT_A_NUMBER = st.one_of(
    st.sampled_from([v for v in NASTY if isinstance(v, bool) or not isinstance(v, int | float)]),
    st.text(max_size=12),
    st.lists(JSON_VALUES, max_size=4),
    st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=3),
)
NOT_TEXT = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.lists(JSON_VALUES, max_size=3),
    st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=3),
)


def outside(lo: float, hi: float) -> st.SearchStrategy:
    """Numbers outside [lo, hi] (just and far), NaN and infinities, and anything that is not a number."""
    return st.one_of(
        st.floats(max_value=lo, exclude_max=True),
        st.floats(min_value=hi, exclude_min=True),
        st.integers(max_value=math.ceil(lo) - 1),
        st.integers(min_value=math.floor(hi) + 1),
        st.sampled_from([math.nan, math.inf, -math.inf, 10**400]),
        NOT_A_NUMBER,
    )


@dataclass(frozen=True)
class Arg:
    """One keyword argument: values the capability accepts, and values it must refuse."""

    valid: st.SearchStrategy
    invalid: st.SearchStrategy
    required: bool = False

    @property
    def either(self) -> st.SearchStrategy:
        return self.valid | self.invalid


def num(lo: float, hi: float, fast_hi: float | None = None, *, required: bool = False) -> Arg:
    """A number valid in [lo, hi]; valid values stop at fast_hi where a larger one makes a motion long."""
    top = hi if fast_hi is None else fast_hi
    return Arg(st.floats(lo, top) | st.sampled_from([lo, top]), outside(lo, hi), required)


def whole(lo: int, hi: int) -> Arg:
    return Arg(st.integers(lo, hi), outside(lo, hi) | st.sampled_from([lo + 0.5, float(hi) + 1e-9]))


def text(*choices: str, required: bool = False) -> Arg:
    return Arg(st.sampled_from(choices), st.sampled_from(["", " ", "\x00", choices[0].upper()]) | ANY, required)


def vec(n: int, lo: float, hi: float) -> st.SearchStrategy:
    return st.lists(st.floats(lo, hi), min_size=n, max_size=n)


def bad_vec(n: int) -> st.SearchStrategy:
    """n numbers with one bad element, a wrong length, or no list at all."""
    bad = st.sampled_from([math.nan, math.inf, 1e308, 10**400, "0.4", None, [0.1], True])
    return st.one_of(
        st.builds(lambda xs, b, i: [*xs[:i], b, *xs[i + 1 :]], vec(n, -2.0, 2.0), bad, st.integers(0, n - 1)),
        st.lists(st.floats(-1, 1), max_size=n + 3).filter(lambda v: len(v) != n),
        NOT_A_NUMBER,
    )


def _unit(q: list[float]) -> list[float]:
    norm = math.sqrt(sum(v * v for v in q))
    return [v / norm for v in q] if norm > 1e-3 else [0.0, 0.0, 0.0, 1.0]


def pose(*, physical: bool, required: bool = False) -> Arg:
    """For physical actions the valid poses lie in a small box above the table (or a few cm above it, to
    meet it), fingers down at a moderate yaw, or far outside the workspace; every such motion is short.
    Read-only capabilities get any position in any orientation. Both get every malformed form."""
    if physical:
        above = st.tuples(st.floats(0.36, 0.48), st.floats(-0.05, 0.08), st.floats(0.2, 0.35))
        low = st.tuples(st.floats(0.38, 0.46), st.floats(-0.03, 0.06), st.floats(0.0, 0.05))
        away = st.tuples(st.floats(0.9, 5.0), st.floats(-1, 1), st.floats(-1.0, 0.5))
        where = st.one_of(above, above, low, away).map(list)
        yaw = st.floats(-60, 60)
        rpy = st.tuples(st.floats(170, 190), st.floats(-10, 10), yaw).map(list)
        orientation = st.one_of(
            st.fixed_dictionaries({"yaw_deg": yaw}),
            st.fixed_dictionaries({"rpy_deg": rpy}),
            st.fixed_dictionaries({"quaternion": st.just([1.0, 0.0, 0.0, 0.0])}),
        )
        flat = st.builds(lambda p: [*p, 1.0, 0.0, 0.0, 0.0], where)
    else:
        where = vec(3, -1.5, 1.5)
        quaternion = vec(4, -1, 1).map(_unit)
        orientation = st.one_of(
            st.fixed_dictionaries({"yaw_deg": st.floats(-720, 720)}),
            st.fixed_dictionaries({"rpy_deg": vec(3, -400, 400)}),
            st.fixed_dictionaries({"quaternion": quaternion}),
        )
        flat = st.builds(lambda p, q: [*p, *q], where, quaternion)
    valid = st.builds(lambda p, o: {"position": p, **o}, where, orientation) | flat
    invalid = st.one_of(
        st.builds(lambda p, o: {"position": p, **o}, bad_vec(3), orientation),
        st.builds(lambda p, q: {"position": p, "quaternion": q}, where, vec(4, -1, 1) | bad_vec(4)),
        st.fixed_dictionaries(
            {"position": where},
            optional={"yaw_deg": ANY, "rpy_deg": ANY, "quaternion": ANY, "frame": st.just("tcp"), "position ": ANY},
        ),
        orientation,  # no position
        st.builds(lambda p, q: [*p, *q], where, vec(4, -1, 1)),  # the flat form, mostly not unit
        bad_vec(7),
        st.dictionaries(st.text(max_size=10), ANY, max_size=3),
        NOT_A_NUMBER,
    )
    return Arg(valid, invalid, required)


# ids the calls before produced: "<det>" is the newest detection, "<det~1>" the one before, ...
HANDLE = Arg(
    st.sampled_from(["<obs>", "<obs>", "<obs~1>", "obs-1"]),
    st.sampled_from(["obs-0", "obs-999", "OBS-1", "obs-1 ", "<det>"]) | ANY,
)
DETECTION = Arg(
    st.sampled_from(["<det>", "<det>", "<det~1>", "<det~2>", "det-1"]),
    st.sampled_from(["det-0", "det-99999", "det--1", "DET-1", "<obs>"]) | ANY,
)
REQUIRED_DETECTION = Arg(DETECTION.valid, DETECTION.invalid, required=True)
CAMERA = text(*CAMERAS)
SCENE_OBJECTS = ("red cube", "black bowl", "green cube", "white plate")
OBJECTS = text(*SCENE_OBJECTS, "cube", "bowl", "unicorn", "red cube \udc00", required=True)
FAST_SPEED = num(0.1, SAFETY.max_tcp_speed_mps)
FORCE = num(SAFETY.contact_threshold_n, SAFETY.force_limit_n)
UV = num(0.0, 1.0, required=True)
PIXEL = {  # "<u>", "<v>": the pixel the last point() found (on an object), else any fraction
    axis: Arg(UV.valid | st.just(f"<{axis}>"), UV.invalid, required=True) for axis in ("u", "v")
}
LABELS = Arg(
    st.text(max_size=20) | st.sampled_from(["\udc00", "cube \ud800"]),
    NOT_TEXT,
)
SPEC: dict[str, dict[str, Arg]] = {
    "observe": {
        "cameras": Arg(
            st.sampled_from([["head"], ["wrist"], ["head", "wrist"], "head", ["wrist", "wrist"]]),
            st.sampled_from([[], ["left"], "HEAD", ["head", 1]]) | ANY,
        )
    },
    "segment": {"text": OBJECTS, "camera": CAMERA, "observation_handle": HANDLE},
    "select_detection": {
        "candidates": Arg(st.lists(DETECTION.valid, min_size=1, max_size=3) | DETECTION.valid, DETECTION.invalid, True),
        "evidence": REQUIRED_DETECTION,
    },
    "point": {"text": OBJECTS, "camera": CAMERA, "observation_handle": HANDLE},
    "mark_point": {
        "observation_handle": HANDLE,
        "camera": CAMERA,
        "u": PIXEL["u"],
        "v": PIXEL["v"],
        "label": LABELS,
        "granularity": text(*GRANULARITIES),
    },
    "track_target": {"detection": REQUIRED_DETECTION, "observation_handle": HANDLE},
    "measure_object_geometry": {"object": REQUIRED_DETECTION, "destination": DETECTION, "shape": text(*SHAPES)},
    "measure_image_points": {
        "observation_handle": HANDLE,
        "camera": CAMERA,
        "points": Arg(st.lists(vec(2, 0.0, 1.0), min_size=1, max_size=5), st.lists(bad_vec(2), max_size=3) | ANY),
    },
    "inspect_contact_geometry": {
        "object": REQUIRED_DETECTION,
        "pose": pose(physical=False),
        "jaw_opening_m": num(0.0, 0.08),
    },
    "inspect_release_geometry": {
        "object": REQUIRED_DETECTION,
        "destination": REQUIRED_DETECTION,
        "position": Arg(vec(2, -1, 1) | vec(3, -1, 1), bad_vec(2) | bad_vec(3)),
    },
    "compare_object_observations": {"before": REQUIRED_DETECTION, "after": REQUIRED_DETECTION},
    "move_to": {  # exactly one of pose and gripper (EXCLUSIVE)
        "pose": pose(physical=True),
        "gripper": Arg(st.sampled_from(["open", "close"]) | st.floats(0.0, 0.08), st.just("half") | outside(0, 0.08)),
        "mode": text("guarded", "manipulation"),
        "speed_mps": FAST_SPEED,
        "duration_s": num(0.0, 60.0, fast_hi=1.0),
        "force_limit_n": FORCE,
    },
    "hold": {"duration_s": num(0.0, 30.0, fast_hi=0.3), "force_limit_n": FORCE},
    "recover": {"distance_m": num(0.001, 0.1), "speed_mps": FAST_SPEED},
    "release": {"opening_m": num(0.0, 0.08)},
    "preview_motion": {
        "pose": pose(physical=False, required=True),
        "speed_mps": num(1e-3, SAFETY.max_tcp_speed_mps),
        "duration_s": num(0.0, 60.0),
    },
    "check_motion": {
        "pose": pose(physical=False, required=True),
        "speed_mps": num(1e-3, SAFETY.max_tcp_speed_mps),
        "duration_s": num(0.0, 60.0),
    },
    "get_robot_state": {},
    "gripper_state": {},
    "robot_geometry": {},
    "read_motion_trajectory": {"motion_id": whole(1, 4), "page": whole(0, 6)},
    "transform_pose": {
        "pose": pose(physical=False, required=True),
        "from_frame": text(*policy_frames(robot.default_profile())),
        "to_frame": text(*policy_frames(robot.default_profile())),
        "offset_m": Arg(vec(3, -0.2, 0.2), bad_vec(3)),
    },
    "finish": {"note": Arg(st.text(max_size=600), NOT_TEXT)},
}
EXCLUSIVE = {"move_to": ("pose", "gripper")}
assert set(SPEC) == set(NAMES), "every capability of the contract is fuzzed"
# keyword arguments no capability takes; "capability" and "self" collide with the dispatcher's own names
UNKNOWN_KEYWORDS = st.sampled_from(["capability", "self", "kwargs", "colour", "speed", "pose ", "", "__class__"])
UNKNOWN_NAMES = st.one_of(
    st.sampled_from(
        [
            "",
            "teleport",
            "mvoe_to",
            "MOVE_TO",
            " move_to",
            "move_to ",
            "_move_to",
            "__init__",
            "_init__",
            "_capture",
            "capture",
            "call",
            "new_episode",
            "gate_objections",
            "cloud",
            "geometry",
            "__class__",
            "_class__",
            "observe\x00",
            "finish()",
            "🤖",
            "x" * 300,
        ]
    ),
    st.text(max_size=30),
)


@st.composite
def valid_arguments(draw, capability: str) -> dict:
    """Keyword arguments the capability accepts: the required ones, some optional ones."""
    spec = SPEC.get(capability, {})
    group = EXCLUSIVE.get(capability, ())
    chosen = draw(st.sampled_from(group)) if group else None
    kwargs = {}
    for name, arg in spec.items():
        wanted = name == chosen if name in group else arg.required or draw(st.booleans())
        if wanted:
            kwargs[name] = draw(arg.valid)
    return kwargs


@st.composite
def arguments(draw, capability: str) -> dict:
    """Valid arguments, or valid ones with one argument wrong, missing or unknown, or every argument
    anything, or a random JSON object."""
    spec = SPEC.get(capability, {})
    kwargs = draw(valid_arguments(capability))
    how = draw(st.sampled_from(["valid", "valid", "one wrong", "one wrong", "one missing", "unknown", "any", "json"]))
    if how == "one wrong" and spec:
        name = draw(st.sampled_from(sorted(spec)))
        kwargs[name] = draw(spec[name].invalid)
    elif how == "one missing" and kwargs:
        del kwargs[draw(st.sampled_from(sorted(kwargs)))]
    elif how == "unknown":
        kwargs[draw(UNKNOWN_KEYWORDS | st.text(max_size=10))] = draw(ANY)
    elif how == "any":
        kwargs = {name: draw(arg.either) for name, arg in spec.items() if draw(st.booleans())}
    elif how == "json":
        kwargs = draw(st.dictionaries(st.text(max_size=12), ANY, max_size=4))
    return kwargs


@st.composite
def calls(draw, physical_weight: int = 1) -> tuple[str, dict]:
    """(capability name, keyword arguments): mostly the contract's names (physical actions
    `physical_weight` times as often as the others), sometimes any other name."""
    names = [n for n in NAMES for _ in range(physical_weight if n in PHYSICAL_CAPABILITIES else 1)]
    name = draw(UNKNOWN_NAMES) if draw(st.integers(0, 9)) == 0 else draw(st.sampled_from(names))
    return name, draw(arguments(name))


# ------------------------------------------------------------------------------ ids the calls produced
@dataclass
class Seen:
    """Observation handles and detection ids the answers so far named, newest last."""

    ids: dict[str, list] = field(default_factory=lambda: {"obs": [], "det": [], "u": [], "v": []})

    def note(self, value: Any) -> None:
        if isinstance(value, dict):
            for key, kind in (("observation_handle", "obs"), ("detection_id", "det")):
                if isinstance(value.get(key), str) and value[key] not in self.ids[kind]:
                    self.ids[kind].append(value[key])
            if isinstance(value.get("uv"), list) and len(value["uv"]) == 2:
                self.ids["u"].append(value["uv"][0])
                self.ids["v"].append(value["uv"][1])
            for item in value.get("detections", []) if isinstance(value.get("detections"), list) else []:
                self.note(item)

    def resolve(self, value: Any) -> Any:
        """Replace placeholders ("<det>", "<det~1>", "<obs>", "<u>", ...) by what they stand for, where known."""
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        if isinstance(value, str) and value.startswith("<") and value.endswith(">"):
            kind, _, back = value[1:-1].partition("~")
            if kind in self.ids and (back.isdigit() or not back):
                known, steps = self.ids[kind], int(back or 0)
                return known[-1 - steps] if steps < len(known) else value
        return value


# ------------------------------------------------------------------------------ the properties
def check_answer(  # noqa: PLR0917 - the fields of a CallResult, from the core or from a message
    capability: str, success: bool, executed: bool, category: str, message: str, receipt: str, answered_as: str
) -> None:
    """What every answer must satisfy, whatever was asked."""
    assert answered_as == capability, f"asked {capability!r}, answered as {answered_as!r}"
    assert category in CATEGORIES, f"failure category {category!r} is not in the closed set"
    assert success == (category == ""), f"success={success} with failure category {category!r}"
    assert 0 < len(receipt) <= RECEIPT_MAX_CHARS, f"receipt of {len(receipt)} characters: {receipt!r}"
    for name, field_text in (("receipt", receipt), ("message", message)):
        try:
            field_text.encode("utf-8")  # a ROS string must be valid UTF-8
        except UnicodeEncodeError:
            raise AssertionError(f"the {name} cannot go on the wire (not UTF-8): {field_text!r}") from None
    if not success:
        assert message.strip(), f"{capability}: failed ({category}) without a message"
        assert "internal error" not in message, f"{capability} crashed: {message}"
    if executed:
        assert capability in PHYSICAL_CAPABILITIES, f"{capability} is not physical, yet executed"
    if capability not in CAPABILITY_BY_NAME:
        assert category == "invalid_argument", message  # malformed args_json may be reported first
        assert "unknown capability" in message or "args_json" in message, message


def record_outcome(capability: str, category: str, executed: bool, where: str = "") -> None:
    """Count outcomes in hypothesis' statistics (pytest --hypothesis-show-statistics)."""
    if currently_in_test_context():
        name = capability if capability in CAPABILITY_BY_NAME else "<unknown name>"
        event(f"{where}{name}: {category or 'ok'}{', executed' if executed else ''}")


@pytest.fixture(scope="module")
def rig():
    """One twin and harness for all examples; each example starts from the same reset state."""
    twin = Twin(TASK)
    twin.reset(START)
    yield twin, Harness(TwinBackend(twin), load_config())
    twin.close()


def _call(harness: Harness, twin: Twin, seen: Seen, capability: str, kwargs: dict, *, where: str = ""):
    kwargs = seen.resolve(kwargs)
    q0, jaw0, actions0 = twin.arm_q(), twin.jaw_opening_m(), harness.budget.actions_used
    result = harness.call(capability, **kwargs)
    category = result.failure_category.value
    record_outcome(capability, category, result.executed, where)
    check_answer(
        capability, result.success, result.executed, category, result.message, result.receipt, result.capability
    )
    json.dumps(result.to_dict(), allow_nan=False)  # what the policy receives is plain JSON
    seen.note(json.loads(result.value_json()))  # what goes on the wire
    result.diagnostics_json()
    if not result.executed:
        moved = np.abs(twin.arm_q() - q0).max()
        assert moved < 1e-4, f"{capability}({kwargs}) moved the arm {moved:.2e} rad without executing"
        assert abs(twin.jaw_opening_m() - jaw0) < 1e-4, f"{capability}({kwargs}) moved the jaw without executing"
    used = harness.budget.actions_used - actions0
    assert used in (0, 1) and (used == 0 or capability in PHYSICAL_CAPABILITIES), f"{capability} used {used} actions"
    assert result.budget.actions_used == harness.budget.actions_used
    return result


# How an honest agent ends wherever the fuzzing left the arm (pressing on the table, say): back to a safe pose
# in manipulation mode (a guarded move stops when a contact releases), open the jaw, one small guarded move.
HONEST_MOVES = (
    ("move_to", {"pose": {"position": [0.42, 0.0, 0.3], "yaw_deg": 0.0}, "mode": "manipulation"}),
    ("move_to", {"gripper": "open"}),
    ("move_to", {"pose": {"position": [0.42, 0.0, 0.32], "yaw_deg": 0.0}}),
)


def _honest_ending(harness: Harness, twin: Twin, seen: Seen) -> None:
    """The gate reads whatever the log holds, and a small move, a check and finish are accepted."""
    harness.gate_objections()
    for capability, kwargs in HONEST_MOVES:
        moved = _call(harness, twin, seen, capability, kwargs, where="ending: ")
        assert moved.success and moved.executed, moved.message
    assert _call(harness, twin, seen, "observe", {}, where="ending: ").success
    finish = _call(harness, twin, seen, "finish", {"note": "fuzzed"}, where="ending: ")
    assert finish.success and finish.value["accepted"], finish.message


# half the sequences start by looking and detecting, so that ids and pixels in later calls can be valid
LOOK_FIRST = st.sampled_from(SCENE_OBJECTS).map(
    lambda obj: [("observe", {}), ("segment", {"text": obj}), ("point", {"text": obj})]
)


@settings(
    derandomize=True,
    deadline=None,
    max_examples=150,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
)
@given(start=st.just([]) | LOOK_FIRST, sequence=st.lists(calls(physical_weight=2), min_size=1, max_size=8))
@example(start=[], sequence=[("mvoe_to", {"pose": {"position": [0.4, 0.0, 0.3], "yaw_deg": 0}})])  # issue 9
@example(start=[], sequence=[("get_robot_state", {"capability": "move_to"}), ("hold", {"self": 1})])
@example(start=[], sequence=[("hold", {"duration_s": 10**400}), ("read_motion_trajectory", {"page": -(10**400)})])
@example(
    start=[("observe", {}), ("point", {"text": "red cube"})],
    sequence=[("mark_point", {"u": "<u>", "v": "<v>", "label": "\udc00"})],
)
def test_every_call_answers_in_the_contract_and_nothing_moves_unless_executed(rig, start, sequence):
    twin, harness = rig
    twin.reset(START)
    harness.new_episode("fuzz")
    seen = Seen()
    for capability, kwargs in start + sequence:
        _call(harness, twin, seen, capability, kwargs)
    _honest_ending(harness, twin, seen)
