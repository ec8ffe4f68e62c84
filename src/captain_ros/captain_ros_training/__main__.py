"""`python -m captain_ros_training <command> [args]` (also `torchrun ... -m captain_ros_training rl sft --fsdp`): the
trainer's commands (captain_ros_training.cli)."""

import sys

from captain_ros_training.cli import main

if __name__ == "__main__":
    code = main()
    if sys.argv[1:2] == ["rl"]:  # a torchrun rank that left its process group ends at once (see exit_process)
        from captain_ros_training.distributed import exit_process

        exit_process(code)
    sys.exit(code)
