"""captain-ros: the project's command-line tool.

captain-ros doctor          check that this machine can run the stack
captain-ros capabilities    the policy-facing API (22 capabilities plus finish)
captain-ros failures        the closed set of failure categories
"""

from __future__ import annotations

import argparse
import sys


def _capabilities(_: argparse.Namespace) -> int:
    from captain_ros.core.contract import CAPABILITIES
    from captain_ros.perception.perception import Perception

    print(f"{'capability':<28} {'group':<12} {'action':<7} {'over ROS':<17} summary")
    for cap in CAPABILITIES:
        served = "/perception/call" if hasattr(Perception, f"_{cap.name}") else "/harness/call"
        print(f"{cap.name:<28} {cap.group:<12} {'yes' if cap.physical else '':<7} {served:<17} {cap.summary}")
    print(
        f"\n{len(CAPABILITIES) - 1} capabilities plus finish(); 'action' ones count against the action budget."
        "\nIn-process, Harness.call() serves all of them; over ROS the motion node serves /harness/call (and the"
        "\nMoveTo action /harness/move_to), the perception node /perception/call."
    )
    return 0


def _failures(_: argparse.Namespace) -> int:
    from captain_ros.core.contract import FAILURE_DESCRIPTIONS

    for category, text in FAILURE_DESCRIPTIONS.items():
        print(f"{category.value:<20} {text}")
    return 0


def _doctor(_: argparse.Namespace) -> int:
    from captain_ros.doctor import run_doctor

    return run_doctor()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="captain-ros", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("doctor", help="check that this machine can run the stack").set_defaults(fn=_doctor)
    sub.add_parser("capabilities", help="list the policy-facing API").set_defaults(fn=_capabilities)
    sub.add_parser("failures", help="list the failure categories").set_defaults(fn=_failures)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
