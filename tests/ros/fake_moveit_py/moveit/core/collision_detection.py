"""moveit_py/src/moveit/moveit_core/collision_detection/collision_common.cpp (core/collision_detection.pyi)."""

from __future__ import annotations

from moveit import _fake


class CollisionRequest:
    def __init__(self) -> None:
        self.joint_model_group_name = ""
        self.distance = False
        self.cost = False
        self.contacts = False
        self.max_contacts = 1
        self.max_contacts_per_pair = 1
        self.max_cost_sources = 1
        self.verbose = False


class Contact:
    """collision_detection::Contact: not a bound type in moveit_py (a map holding one cannot be read)."""

    def __init__(self, body_name_1: str, body_name_2: str) -> None:
        self.body_name_1, self.body_name_2 = body_name_1, body_name_2


class CollisionResult:
    def __init__(self) -> None:
        self.collision = False
        self.distance = float("inf")
        self.contact_count = 0
        self._contacts: dict[tuple[str, str], list[Contact]] = {}
        self.cost_sources: list = []

    @property
    def contacts(self) -> dict:
        """pybind11 converts std::map<pair<string,string>, vector<Contact>>: with an entry, the unregistered Contact
        raises TypeError."""
        if self._contacts and not _fake.STATE.contacts_readable:
            raise TypeError("Unregistered type : collision_detection::Contact")
        return dict(self._contacts)
