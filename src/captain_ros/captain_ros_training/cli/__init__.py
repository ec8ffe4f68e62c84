"""The trainer's command lines: argument parsing and dispatch over the trainer's modules, one module per command."""
