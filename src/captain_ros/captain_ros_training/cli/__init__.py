"""The trainer's command lines: argument parsing and dispatch over the trainer's modules, one module per command.

  python -m captain_ros_training.rl {sft-data,sft,rl,plot}   cli/rl_cli.py           SFT and RL on an episode store
  python -m captain_ros_training.rl_host {run,export}        cli/rl_host_cli.py      RL rounds on a GPU host, resumable
  python -m captain_ros_training.student {build,check,merge} cli/student_cli.py      the real student's folder
  python -m captain_ros_training.student_eval run            cli/student_eval_cli.py a model evaluated on the twin
  python -m captain_ros_training.token_rows {fit,apply}      cli/token_rows_cli.py   rows the base never trained
  python -m captain_ros_training.sft_then_rl                 cli/sft_then_rl_cli.py  an SFT-then-RL run on the twin
  python -m captain_ros_training.hf_serve                    cli/hf_serve_cli.py     a transformers policy server

Each command keeps the name the docs, tools/student_gpu_host.sh and torchrun give it (`python -m
captain_ros_training.<module>`, also its --help's usage line): that module's `__main__` block runs this package's
`main`; `python -m captain_ros_training.cli.<module>` runs it too. The work is in the modules themselves.
"""
