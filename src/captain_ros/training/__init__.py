"""Off-robot trainer: prompt gate, SFT, simulator critic and critic-credited RL."""
