"""`python -m captain_ros_training.rl {sft-data,sft,rl,plot}`: the trainer's command line under the name the docs,
tools/student_gpu_host.sh and `torchrun ... -m captain_ros_training.rl sft --fsdp` use; it is
captain_ros_training.cli.rl_cli."""

if __name__ == "__main__":
    from captain_ros_training.cli.rl_cli import main
    from captain_ros_training.distributed import exit_process

    exit_process(main())
