"""Perception from RGB-D (ROS-free): observations under handles, the built-in segmenter, detections
and metric geometry. No simulator state is ever read here."""
