"""Sim bridge: records twin episodes (privileged state, exact tokens and logprobs) and ships them to the trainer."""
