"""The harness core (ROS-free): guarded motion, receipts, budgets and the completion gate over one
arm backend interface with a twin and a ros2_control implementation."""
