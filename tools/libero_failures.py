#!/usr/bin/env python3
"""The failure classes of the scripted expert's LIBERO episodes, each with an example transcript.

Every episode of the stores that is not a strict success is put in the first class whose rule matches: the outcome
(false or missed finish), or else what the expert's cells printed (their `result:` and `status:` lines and the
measurements before them; the cells' comments are not read). The rules key on the expert's own words
(captain_ros.agent.expert), so they classify its episodes, not another policy's. Writes OUT/README.md (the table:
per class its episodes by suite, its tasks, what happens, where a fix belongs, and a link to an example) and
OUT/<class>.md (the first episode of the class's most common task as `captain-ros eval transcript --brief` renders it).

  python tools/libero_failures.py RUN/appearance/*-eval/rollout.sqlite --out docs/libero_transcripts

bench/libero.py prints the stores of its run at the end.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src" / "captain_ros"))

from captain_ros.bridge.evaluation import EvaluationError, load_rows, stored_transcript  # noqa: E402

SUITE_ORDER = ("libero_spatial", "libero_object", "libero_goal", "libero_10")


@dataclass(frozen=True)
class FailureClass:
    name: str
    what: str  # what happens, in a sentence
    fix: str  # where a fix belongs
    pattern: str = ""  # a regex over the printed lines; empty: the outcome decides
    outcome: str = ""


CLASSES = (
    FailureClass(
        "declined",
        "the expert does not parse the instruction into goals it scripts and stops at once: the push family, and "
        "libero_10's 'put ... in the drawer (microwave) and close it' and 'put ... to the right of the plate'",
        "the expert: a push primitive, and the parser (a closing goal after a placing one, side relations)",
        pattern=r"cannot turn the instruction",
    ),
    FailureClass(
        "false_finish",
        "finish() on a scene the goal predicate fails: a look-alike was moved, or the wrong drawer judged",
        "perception (relations when the references are not both in view) and the expert's verification",
        outcome="false_finish",
    ),
    FailureClass(
        "missed_finish",
        "the goal holds but the expert's verification cannot see it (an upright grocery seen from straight above, a "
        "bowl on the dark cabinet top, a box tilted in a bowl) and it stops without finish()",
        "perception: top views in the appearance library; rim fits from the wrist camera",
        outcome="missed_finish",
    ),
    FailureClass(
        "verify_vs_survey",
        "the survey judges the goal done, the verification measures another region (the destination's own) and says "
        "not met, until the attempts run out",
        "perception of a vessel on a flat fixture (both the survey's 'done' and the verification's region are wrong: "
        "picking as the survey does made these false finishes)",
        pattern=r"already satisfies the goal\n(?:.*\n)*?status: failed_",
    ),
    FailureClass(
        "approach_collision",
        "the move above the object meets something at once (well over 100 N): the target is a region inside or under "
        "a fixture",
        "perception: regions inside fixtures; the expert: a clearance check before the approach",
        pattern=r"could not get above the object: contact: \d{3}",
    ),
    FailureClass(
        "descent_stopped_on_top",
        "a closed can, box or bottle is measured as an open vessel (a cylinder wider than 7 cm) and grasped by its "
        "'rim': the descent stops on its lid",
        "the expert's grasp choice: across the body of a closed cylinder that fits the jaw",
        pattern=r"the descent stopped \(contact_stop\) at",
    ),
    FailureClass(
        "grasp_slipped_or_dropped",
        "the grasp closes on the thin rim of a bowl or the handle slips, and the object (or the drawer) is lost on "
        "the way",
        "the expert's rim grasp depth; the harness's slip detection already reports it",
        pattern=r"slipped out|no longer in the gripper|status: slipped",
    ),
    FailureClass(
        "fixture_not_found",
        "a fixture (the stove's knob, a drawer) is not found in the head camera's view, or is found on a region out "
        "of the arm's reach (a knob 'behind' the robot)",
        "perception: fixtures by appearance, not only by shape; candidates outside the workspace left out",
        pattern=r"no stove with a knob|no drawer found|no reachable arc round the knob",
    ),
    FailureClass(
        "no_reachable_grasp",
        "the target or destination is named on the wrong region (a look-alike merged with its neighbour, the "
        "wooden cabinet, or the robot's own mount at the base), so no grasp or place plan exists",
        "perception: naming, and leaving out the robot's own body",
        pattern=r"no clear, reachable grasp",
    ),
    FailureClass(
        "not_found",
        "the target is not found from the head camera or from above",
        "perception: naming",
        pattern=r"found from the head camera or from above",
    ),
)
OTHER = FailureClass("other", "none of the rules above", "read the transcript")


def printed(transcript: str) -> str:
    """A brief transcript without the cells' comment lines: what the cells printed, and the headings."""
    return "\n".join(line for line in transcript.splitlines() if not line.lstrip().startswith("#"))


def classify(row, transcript: str) -> FailureClass:
    text = printed(transcript)
    for c in CLASSES:
        if (c.outcome and row.outcome == c.outcome) or (c.pattern and re.search(c.pattern, text)):
            return c
    return OTHER


def _order(row) -> tuple:
    suite = row.task.split("/")[0]
    index = row.task.split("/")[-1]
    return (
        SUITE_ORDER.index(suite) if suite in SUITE_ORDER else len(SUITE_ORDER),
        suite,
        int(index) if index.isdigit() else 0,
        row.start_id,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stores", nargs="+", type=Path, help="episode stores of LIBERO evaluations (rollout.sqlite)")
    parser.add_argument("--out", type=Path, required=True, help="folder for README.md and one transcript per class")
    args = parser.parse_args(argv)
    found: dict[str, list] = {}
    total = Counter()
    try:
        for store in args.stores:
            for row in sorted(load_rows(store), key=_order):
                if not row.valid:
                    continue
                total[row.family] += 1
                if row.outcome == "success":
                    continue
                transcript = stored_transcript(store, row.episode_id, brief=True)
                found.setdefault(classify(row, transcript).name, []).append((row, store, transcript))
    except EvaluationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.md"):  # a class with no episode this time keeps no example
        old.unlink()
    by_name = {c.name: c for c in (*CLASSES, OTHER)}
    failures = sum(len(v) for v in found.values())
    lines = [
        "# The scripted expert's LIBERO failures, by class",
        "",
        f"Written by `python tools/libero_failures.py` from {len(args.stores)} evaluation store(s): "
        f"{sum(total.values())} valid episodes ({', '.join(f'{s} {n}' for s, n in sorted(total.items()))}), "
        f"{failures} not a strict success. Each episode is in the first class whose rule matches (the rules read "
        "what the expert's cells printed; see the tool). Each class links the first episode of its most common task as "
        "`captain-ros eval transcript --brief` renders it (each cell's reasoning as comments, what it printed).",
        "",
        "| class | episodes | by suite | tasks | what happens | where a fix belongs | example |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in (*CLASSES, OTHER):
        episodes = found.get(c.name, [])
        if not episodes:
            continue
        suites = Counter(row.family for row, _, _ in episodes)
        tasks = Counter(row.task for row, _, _ in episodes)
        common = tasks.most_common(1)[0][0]  # the example: the first episode of the class's most common task
        row, store, transcript = next(e for e in episodes if e[0].task == common)
        (args.out / f"{c.name}.md").write_text(
            f"<!-- captain-ros eval transcript {store} --episode {row.episode_id} --brief -->\n\n{transcript}",
            encoding="utf-8",
        )
        lines.append(
            f"| {c.name} | {len(episodes)} | {', '.join(f'{s} {n}' for s, n in suites.items())} | "
            f"{', '.join(f'{t} ({n})' for t, n in sorted(tasks.items()))} | {by_name[c.name].what} | "
            f"{by_name[c.name].fix} | [{row.task}, state {row.start_id}]({c.name}.md) |"
        )
    (args.out / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    width = max(len(n) for n in found) if found else 5
    for name, episodes in sorted(found.items(), key=lambda kv: -len(kv[1])):
        print(f"{name:<{width}}  {len(episodes):4d}  {dict(Counter(row.family for row, _, _ in episodes))}")
    print(f"{failures} failures of {sum(total.values())} episodes; table and examples in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
