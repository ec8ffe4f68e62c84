"""The MuJoCo twin: a model compiled from a robot profile's URDF plus a tabletop scene, a task suite,
start states with stable ids, cameras, and the training-only privileged state. ROS-free."""
