"""The names of the 36 privileged features x(s_t) (CaPtain App. A.2), in the order the critic reads them.

A module of its own with no imports, so the trainer can read them without MuJoCo (twin/privileged_state.py computes
them; captain_ros_training/critic.py consumes them)."""

FEATURE_NAMES: tuple[str, ...] = (
    # end effector and jaw
    "ee_x_m",
    "ee_y_m",
    "ee_z_m",
    "jaw_opening_m",
    "jaw_commanded_closed",
    # goal bookkeeping
    "n_goals",
    "n_goals_satisfied",
    "frac_goals_satisfied",
    "active_goal_index",
    "active_goal_is_joint",
    "active_goal_is_contact",
    # distances
    "target_goal_dist",
    "target_goal_dist_norm",
    "ee_target_dist_m",
    "ee_target_dist_xy_m",
    "ee_target_dz_m",
    "target_dest_dist_xy_m",
    "target_dest_dz_m",
    # target lift and displacement
    "target_lift_m",
    "target_displacement_m",
    "max_other_displacement_m",
    "nearest_other_dist_m",
    "target_bottom_z_m",
    "target_tilt_rad",
    "target_speed_mps",
    "ee_speed_mps",
    # articulated joint
    "joint_pos_m",
    "joint_pos_norm",
    "joint_change_m",
    "joint_goal_progress",
    # held flags and contact
    "target_held",
    "target_ever_held",
    "left_pad_touches_target",
    "right_pad_touches_target",
    "target_between_pads",
    "ladder_fraction",
)
assert len(FEATURE_NAMES) == 36
