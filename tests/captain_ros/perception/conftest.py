import pytest

from captain_ros.core.config import load_config
from captain_ros.core.kinematics import Kinematics
from captain_ros.harness.harness import Harness
from captain_ros.harness.twin_backend import TwinBackend
from captain_ros.twin.sim import Twin

TASK = "put_red_cube_in_bowl"


@pytest.fixture(scope="session")
def kinematics():
    return Kinematics()


@pytest.fixture
def twin():
    t = Twin(TASK)
    t.reset(f"{TASK}/wide/3")
    yield t
    t.close()


@pytest.fixture
def harness(twin, kinematics):
    return Harness(TwinBackend(twin), load_config(), kinematics)


def pixel_of(twin, name: str, camera: str = "head") -> tuple[float, float]:
    """Ground truth for tests only: a pixel (as fractions) at the centre of the object's true mask."""
    import numpy as np

    ids = twin._rig.render_body_ids(twin.data, camera)
    v, u = np.nonzero(ids == twin.model.body(name).id)
    i = int(np.argmin((u - u.mean()) ** 2 + (v - v.mean()) ** 2))
    return u[i] / (ids.shape[1] - 1), v[i] / (ids.shape[0] - 1)
