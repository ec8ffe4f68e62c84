"""The code-as-policy agent: episode loop, context, completion gate, sandbox, policy client, scripted expert.
ROS-free; the agent node (captain_ros.ros.agent_node) is a thin shell over it."""
