"""The off-robot trainer (CaPtain §3.2-3.3, AgenticRoboRL): prompt gate, SFT, simulator critic, critic-credited RL.

It reads episodes through captain_ros.bridge.store.EpisodeReader. torch and transformers are imported here and
nowhere on the robot side: nothing under captain_ros imports this package."""
