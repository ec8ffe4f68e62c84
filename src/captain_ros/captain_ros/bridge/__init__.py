"""The sim bridge: recording proxy, episode store, transport, rollouts, evaluation. ROS-free; it hands twin
episodes from the robot stack to the trainer."""
