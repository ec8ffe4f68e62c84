"""franka_hardware's own settings, made at configure through its services (franka_ros2 v3.4.0).

franka_hardware serves `~/set_force_torque_collision_behavior` and `~/set_load` on its `service_server` node
(franka_param_service_server.cpp), and refuses them while a motion runs. The motion node calls both once the graph
check found them and before it moves anything: the contact and collision-reflex thresholds the profile declares
(`interfaces.franka`), then the payload (`payload`: what the arm carries beyond the hand Desk knows of). Both matter
to the wrench this stack guards with: franka_hardware estimates it from the joint torques and its model, so a
payload it was not told of reads as a constant force, and the arm's own reflex fires at the upper thresholds
whatever this stack's limits say.
"""

from __future__ import annotations

import threading

from franka_msgs.srv import SetForceTorqueCollisionBehavior, SetLoad

from captain_ros.core.robot import FrankaSettings, Payload
from captain_ros.harness.backend import BackendError
from captain_ros.ros.spin import SideNode

SET_LOAD_TYPE = "franka_msgs/srv/SetLoad"
COLLISION_BEHAVIOR_TYPE = "franka_msgs/srv/SetForceTorqueCollisionBehavior"


def _call(node: SideNode, srv_type, name: str, request, timeout_s: float):
    client = node.create_client(srv_type, name)
    try:
        if not client.wait_for_service(timeout_sec=timeout_s):
            raise BackendError(f"{name} did not answer within {timeout_s:g} s (is franka_hardware running?)")
        done = threading.Event()
        future = client.call_async(request)
        future.add_done_callback(lambda _: done.set())
        if not done.wait(timeout_s):
            future.cancel()
            raise BackendError(f"{name} did not reply within {timeout_s:g} s")
        reply = future.result()
    finally:
        node.destroy_client(client)
    if not reply.success:
        why = reply.error or "no reason given"
        raise BackendError(f"{name} refused: {why} (franka_hardware refuses these while the arm moves)")
    return reply


def apply_settings(host, settings: FrankaSettings, payload: Payload, timeout_s: float) -> str:
    """Set the collision behaviour, then the payload, through franka_hardware's services (names resolved in
    `host`'s namespace). Returns what was set, for the log; BackendError names the service that failed and why."""
    node = SideNode(host, "franka_settings")
    node.start()
    try:
        behavior = SetForceTorqueCollisionBehavior.Request(
            lower_torque_thresholds_nominal=list(settings.lower_torque_thresholds_nm),
            upper_torque_thresholds_nominal=list(settings.upper_torque_thresholds_nm),
            lower_force_thresholds_nominal=list(settings.lower_force_thresholds_n),
            upper_force_thresholds_nominal=list(settings.upper_force_thresholds_n),
        )
        name = host.resolve_service_name(settings.collision_behavior_service)
        _call(node, SetForceTorqueCollisionBehavior, name, behavior, timeout_s)
        com = list(payload.center_of_mass_m)
        load = SetLoad.Request(mass=payload.mass_kg, center_of_mass=com, load_inertia=[0.0] * 9)  # a point mass
        _call(node, SetLoad, host.resolve_service_name(settings.set_load_service), load, timeout_s)
    finally:
        node.close()
    force, torque = settings.upper_force_thresholds_n[:3], settings.upper_torque_thresholds_nm
    return (
        f"franka_hardware: collision reflex at {min(force):g}-{max(force):g} N and {min(torque):g}-{max(torque):g} "
        f"N m per joint, payload {payload.mass_kg:g} kg at {list(payload.center_of_mass_m)} m (flange frame)"
    )
