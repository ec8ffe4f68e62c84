import pytest

from captain_ros.core.config import load_config
from captain_ros.core.kinematics import Kinematics
from captain_ros.harness.harness import Harness
from captain_ros.harness.twin_backend import TwinBackend
from captain_ros.twin.sim import Twin


@pytest.fixture(scope="session")
def kinematics():
    return Kinematics()


@pytest.fixture
def twin():
    t = Twin("put_red_cube_in_bowl")
    t.reset("put_red_cube_in_bowl/official/0")
    return t


@pytest.fixture
def harness(twin, kinematics):
    return Harness(TwinBackend(twin), load_config(), kinematics)
