"""Thin ROS 2 shells over `captain_ros.core`. Everything here may import rclpy."""
