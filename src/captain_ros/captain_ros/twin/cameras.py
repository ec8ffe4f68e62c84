"""Offscreen RGB + metric depth for the twin's cameras, one render pass per camera.

mujoco.Renderer renders a second time for depth; here each camera is rendered once and both
the colour and the depth buffer are read back from that pass. Shadows, reflections, the
skybox and collision-only geom groups are switched off (they dominate the cost on Mesa).
Depth is z-depth in metres along the optical axis (as sensor_msgs/Image 32FC1 depth).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import mujoco
import numpy as np

from captain_ros.twin.scene import IMAGE_SIZE_PX, intrinsics


@dataclass(frozen=True)
class CameraFrame:
    """One camera's image pair and calibration. Poses are of the optical frame in the base frame: the
    rendered (true) pose from `CameraRig.render`, the calibrated one from `Twin.observe`."""

    name: str
    rgb: np.ndarray  # (H, W, 3) uint8
    depth_m: np.ndarray  # (H, W) float32, metres; 0 where nothing was hit within range
    K: np.ndarray  # (3, 3)
    position_m: np.ndarray  # (3,) optical frame origin in the base frame
    rotation: np.ndarray  # (3, 3) optical frame axes (columns) in the base frame


class CameraRig:
    """Renders named cameras of a model. Not thread-safe: one rig per thread or process."""

    def __init__(self, model: mujoco.MjModel, width_px: int = IMAGE_SIZE_PX, height_px: int = IMAGE_SIZE_PX):
        if mujoco.GLContext.__module__.endswith("glfw") and not os.environ.get("DISPLAY"):
            raise RuntimeError(
                "offscreen rendering needs MUJOCO_GL=egl or osmesa set before mujoco is imported "
                "(captain_ros.twin sets egl when it is imported first)"
            )
        self.model = model
        self.width, self.height = width_px, height_px
        self._gl = mujoco.GLContext(width_px, height_px)
        self._gl.make_current()
        self._context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._context)
        self._scene = mujoco.MjvScene(model, maxgeom=2000)
        self._scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        self._scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        self._scene.flags[mujoco.mjtRndFlag.mjRND_SKYBOX] = 0
        self._option = mujoco.MjvOption()
        self._perturb = mujoco.MjvPerturb()
        self._camera = mujoco.MjvCamera()
        self._camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self._viewport = mujoco.MjrRect(0, 0, width_px, height_px)
        self._rgb = np.empty((height_px, width_px, 3), dtype=np.uint8)
        self._depth = np.empty((height_px, width_px), dtype=np.float32)
        extent = model.stat.extent
        self._near = model.vis.map.znear * extent
        self._far = model.vis.map.zfar * extent

    def render(self, data: mujoco.MjData, camera: str) -> CameraFrame:
        cam_id = self.model.cam(camera).id
        self._gl.make_current()
        self._camera.fixedcamid = cam_id
        mujoco.mjv_updateScene(
            self.model, data, self._option, self._perturb, self._camera, mujoco.mjtCatBit.mjCAT_ALL, self._scene
        )
        mujoco.mjr_render(self._viewport, self._scene, self._context)
        mujoco.mjr_readPixels(self._rgb, self._depth, self._viewport, self._context)
        rgb = np.flipud(self._rgb).copy()
        buf = np.flipud(self._depth)
        # OpenGL's depth buffer -> metres along the axis, in float32 throughout (0 where nothing was hit)
        depth = np.float32(1.0 - self._near / self._far) * buf
        np.subtract(np.float32(1.0), depth, out=depth)
        np.divide(np.float32(self._near), depth, out=depth)
        depth[buf >= 1.0] = 0.0
        # MuJoCo's camera frame (x right, y up, z back) -> optical frame (x right, y down, z forward)
        rotation = data.cam_xmat[cam_id].reshape(3, 3) @ np.diag([1.0, -1.0, -1.0])
        return CameraFrame(
            camera,
            rgb,
            depth,
            intrinsics(self.model, camera, self.width, self.height),
            data.cam_xpos[cam_id].copy(),
            rotation,
        )

    def render_body_ids(self, data: mujoco.MjData, camera: str) -> np.ndarray:
        """EVALUATION ONLY (ground-truth masks for benchmarks): the body id seen at each pixel, -1 where
        no geom is hit. Never used by perception."""
        self._gl.make_current()
        self._camera.fixedcamid = self.model.cam(camera).id
        mujoco.mjv_updateScene(
            self.model, data, self._option, self._perturb, self._camera, mujoco.mjtCatBit.mjCAT_ALL, self._scene
        )
        self._scene.flags[mujoco.mjtRndFlag.mjRND_SEGMENT] = 1
        self._scene.flags[mujoco.mjtRndFlag.mjRND_IDCOLOR] = 1
        try:
            mujoco.mjr_render(self._viewport, self._scene, self._context)
            mujoco.mjr_readPixels(self._rgb, None, self._viewport, self._context)
        finally:
            self._scene.flags[mujoco.mjtRndFlag.mjRND_SEGMENT] = 0
            self._scene.flags[mujoco.mjtRndFlag.mjRND_IDCOLOR] = 0
        rgb = np.flipud(self._rgb).astype(np.int64)
        segid = rgb[..., 0] + rgb[..., 1] * 256 + rgb[..., 2] * 65536 - 1  # index into the scene's geoms
        body_of_segid = np.full(self._scene.ngeom + 1, -1, dtype=np.int64)
        for i in range(self._scene.ngeom):
            g = self._scene.geoms[i]
            if g.objtype == mujoco.mjtObj.mjOBJ_GEOM:
                body_of_segid[i] = self.model.geom_bodyid[g.objid]
        return np.where((segid >= 0) & (segid < self._scene.ngeom), body_of_segid[np.clip(segid, 0, None)], -1)

    def close(self) -> None:
        """Free the GL resources IN THIS RIG'S CONTEXT. GL object names are per context: freeing an MjrContext
        while another rig's context is current deletes that rig's framebuffers instead, and its next render
        reads garbage depth (seen as a table that vanished from a head-camera cloud, in the full test run
        only: when a twin nobody closed was garbage-collected mid-test). Also run when the rig is collected."""
        if self._gl is not None:
            # a context still current in the thread that rendered cannot be made current here (EGL_BAD_ACCESS:
            # twin_node closes a twin from another thread than its simulation's); it is then freed as it is
            with contextlib.suppress(Exception):
                self._gl.make_current()
            self._context.free()
            self._gl.free()
            self._gl = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: GL may be gone already
            self.close()

    def __enter__(self) -> CameraRig:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
