"""ROS-free core of the harness: importable and testable without rclpy."""
