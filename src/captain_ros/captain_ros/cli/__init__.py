"""captain-ros (also `python -m captain_ros.cli`): the project's command-line tool.

captain-ros run                  the main job: episodes on the twin over ROS (expert policy by default)
captain-ros rollout              record episodes for training in a world (--backend twin|libero), shipped
captain-ros eval                 run|report|compare: evaluation over suites x start states x attempts
captain-ros export               mcap|parquet: episodes for ROS tools (rosbag2 MCAP) and tables for analysis
captain-ros transport            receive|ship: the trainer-side receiver and the rollout host's shipper
captain-ros gap                  the sim-to-real gap report of an episode
captain-ros proxy                the recording proxy in front of a policy server (rollout starts one)
captain-ros expert-server        the scripted expert as a policy server (run and rollout start one)
captain-ros rviz-config          write (or --check) config/rviz/<profile>.rviz of every robot profile
captain-ros appearance-library   build (or load) LIBERO's appearance library and list its models
captain-ros approve              answer the motion node's approval requests in this terminal (approval mode)
captain-ros doctor               check that this machine can run the stack
captain-ros capabilities         the policy-facing API (22 capabilities plus finish)
captain-ros failures             the closed set of failure categories
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading


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


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from captain_ros.stack import RunOptions, Stack
    from captain_ros.worlds import WorldOptions, world

    try:  # the twin node stands in for the arm: the tasks are the twin world's, checked before anything starts
        world(RUN_TASKS_FROM).tasks(args.task, WorldOptions())
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    options = RunOptions(
        tasks=args.task,
        start_id=args.start_id,
        split=args.split,
        episodes=args.episodes,
        policy_url=args.policy_url,
        model=args.model,
        runs_dir=Path(args.runs_dir),
        real_time_factor=args.real_time_factor,
        send_images=not args.no_images,
    )
    return Stack(options).run()


def _approve(args: argparse.Namespace) -> int:
    from captain_ros.ros.safety import run_approve_prompt

    return run_approve_prompt(args.namespace)


def _rollout(args: argparse.Namespace) -> int:
    from captain_ros.cli.rollout_cli import run_rollout

    return run_rollout(args)


RUN_TASKS_FROM = "twin"  # the world whose tasks `run` (the twin node behind ros2_control) takes


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="captain-ros", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="run whole episodes on the twin over ROS (the main job)",
        description="Bring up the twin, motion, perception and agent nodes (and the scripted-expert policy "
        "server unless --policy-url is given) as processes, run episodes with a live view, print a summary "
        "table and leave each episode's transcript under --runs-dir. The ROS launch equivalent is "
        "`ros2 launch captain_ros agent.launch.py`.",
    )
    run.add_argument(
        "--task",
        default="put_red_cube_in_bowl,stack_red_on_blue,open_drawer",
        help="task name, or a comma-separated list the episodes cycle through (see config/tasks.yaml)",
    )
    run.add_argument("--start-id", default="", help="a start-state id such as put_red_cube_in_bowl/official/3")
    run.add_argument("--split", default="eval", choices=["train", "eval", "any"], help="split start ids come from")
    run.add_argument("--episodes", type=int, default=3, help="number of episodes")
    run.add_argument(
        "--policy-url",
        default="",
        help="OpenAI-compatible policy server, e.g. http://127.0.0.1:8000/v1 for vLLM; empty: the scripted expert",
    )
    run.add_argument("--model", default="", help="served model name (empty: the server's only model)")
    run.add_argument("--runs-dir", default="runs", help="where transcripts, summaries and node logs go")
    run.add_argument(
        "--real-time-factor", type=float, default=1.0, help="twin speed; budgets follow its clock (sim time)"
    )
    run.add_argument("--no-images", action="store_true", help="do not attach camera images (text-only models)")
    run.set_defaults(fn=_run)
    from captain_ros.cli.rollout_cli import add_rollout_arguments

    rollout = sub.add_parser(
        "rollout",
        help="record episodes for training (on the twin, or another in-process world: --backend)",
        description="Run groups of G attempts per start state on N parallel workers in a world (the twin unless "
        "--backend names another of captain_ros.worlds) with the policy behind "
        "the recording proxy; every request's model call and privileged snapshot go to the episode store "
        "(<run dir>/rollout.sqlite), which the shipper streams to a trainer-side receiver (a local one, "
        "<run dir>/trainer.sqlite, unless --ship names the trainer's).",
    )
    add_rollout_arguments(rollout)
    rollout.set_defaults(fn=_rollout)
    for name, (_, text) in DELEGATED.items():
        sub.add_parser(name, help=text, add_help=False)
    approve = sub.add_parser(
        "approve",
        help="answer the motion node's approval requests in this terminal (approval mode)",
        description="Show each physical action the motion node holds for approval (approval_mode:=true) and "
        "answer it: y approves, n rejects, either followed by an optional note. No answer within the node's "
        "approval_timeout_s fails the call and the arm holds. Also prints e-stop changes. Ctrl-C quits.",
    )
    approve.add_argument("--namespace", default="", help="the motion node's namespace (default: the root)")
    approve.set_defaults(fn=_approve)
    sub.add_parser("doctor", help="check that this machine can run the stack").set_defaults(fn=_doctor)
    sub.add_parser("capabilities", help="list the policy-facing API").set_defaults(fn=_capabilities)
    sub.add_parser("failures", help="list the failure categories").set_defaults(fn=_failures)
    return parser


# commands whose module parses its own arguments (`captain-ros eval --help` shows theirs): command -> (its module in
# this package, <name>_cli.py; its help). The library modules they call import nothing from this package.
DELEGATED = {
    "eval": ("evaluation_cli", "evaluation: run episodes and report, or report/compare stores (eval --help)"),
    "export": ("export_cli", "export episodes to rosbag2 MCAP or Parquet (export --help)"),
    "transport": ("transport_cli", "the trainer-side receiver and the shipper (transport --help)"),
    "gap": ("gap_cli", "the sim-to-real gap report of an episode: shadow predictions beside outcomes (gap --help)"),
    "proxy": ("proxy_cli", "the recording proxy in front of an OpenAI-compatible policy server (proxy --help)"),
    "expert-server": ("expert_server_cli", "the scripted expert as an OpenAI-compatible policy server"),
    "rviz-config": ("rviz_config_cli", "write (or --check) the rviz2 configuration of every robot profile"),
    "appearance-library": ("appearance_library_cli", "build (or load) LIBERO's appearance library, list its models"),
}


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """A SIGTERM stops a command as Ctrl-C does: the rollout host stops its workers and services (a proxy, shipper or
    receiver started in a session of its own would outlive a process SIGTERM ended at once), the main job stops its
    stack with the arm holding."""
    argv = sys.argv[1:] if argv is None else list(argv)
    main_thread = threading.current_thread() is threading.main_thread()  # only there may a handler be set
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
    try:
        if argv and argv[0] in DELEGATED:
            from importlib import import_module

            return import_module(f"{__name__}.{DELEGATED[argv[0]][0]}").main(argv[1:])
        args = build_parser().parse_args(argv)
        return args.fn(args)
    except KeyboardInterrupt:
        print("captain-ros: interrupted; the workers and services it started were stopped", file=sys.stderr)
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
