"""moveit_py/src/moveit/moveit_core/collision_detection/collision_common.cpp and collision_matrix.cpp
(core/collision_detection.pyi)."""

from __future__ import annotations

from moveit import _fake


class AllowedCollisionMatrix:
    """collision_matrix.cpp's binding of collision_detection::AllowedCollisionMatrix: py::init(names, default_entry),
    get_entry, set_entry(name1, name2, allowed) (the only setEntry overload bound), remove_entry, clear. No __copy__
    is bound: a copy comes from a cloned PlanningScene's allowed_collision_matrix."""

    def __init__(self, names: list[str], default_entry: bool = False) -> None:
        self._entries: dict[str, dict[str, str]] = {}
        for i, a in enumerate(names):  # AllowedCollisionMatrix(names, allowed): every pair, each name with itself
            for b in names[i:]:
                self.set_entry(a, b, default_entry)

    def get_entry(self, name1: str, name2: str) -> tuple[bool, str]:
        """getEntry: (whether the pair has an entry, its type). The C++ leaves the type unset for a pair without an
        entry; the fake says "UNKNOWN" then."""
        kind = self._entries.get(name1, {}).get(name2)
        return (kind is not None, kind or "UNKNOWN")

    def set_entry(self, name1: str, name2: str, allowed: bool) -> None:
        kind = "ALWAYS" if allowed else "NEVER"
        self._entries.setdefault(name1, {})[name2] = kind
        self._entries.setdefault(name2, {})[name1] = kind

    def remove_entry(self, name1: str, name2: str) -> None:
        self._entries.get(name1, {}).pop(name2, None)
        self._entries.get(name2, {}).pop(name1, None)

    def clear(self) -> None:
        self._entries.clear()

    def allows(self, name1: str, name2: str) -> bool:
        """(fake) getAllowedCollision as the collision checker asks it: the pair's entry is ALWAYS."""
        return self._entries.get(name1, {}).get(name2) == "ALWAYS"

    def _copy(self) -> AllowedCollisionMatrix:
        """(fake) the C++ copy constructor, as PlanningScene::clone uses it; not a Python-visible binding."""
        out = AllowedCollisionMatrix([])
        out._entries = {k: dict(v) for k, v in self._entries.items()}
        return out


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
