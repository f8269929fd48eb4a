"""A device mesh and the process groups a job makes of it, named as torch names them.

Every rank calls `new_group` for every subgroup of a mesh dimension (DeviceMesh does), so gloo's groups
take the names of one counter shared by all ranks ("1", "2", ...), and every group of a dimension has the
description `mesh_<dim>`. With NCCL initialised eagerly, DeviceMesh calls `split_group` instead, which
names each group by a hash of its ranks (torch's `_hash_ranks_to_str`). The world is group "0",
`default_pg`. A group is therefore told apart by its name *and* its ranks, never by its description.

A job that calls `new_group` itself makes the groups of the dimensions it uses only (`grouped`): a world cut
into halves has no group of the ranks that hold the same place in each half.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

WORLD = "world"


@dataclass(frozen=True)
class Group:
    name: str  # the process group's name (pg_config's key, the entries' process_group[0])
    desc: str  # "default_pg", "mesh_tp", "undefined"
    ranks: tuple[int, ...]
    dim: str  # the mesh dimension it belongs to, or WORLD

    def local(self, rank: int) -> int:
        return self.ranks.index(rank)


def hashed_name(ranks: tuple[int, ...]) -> str:
    """torch's `_hash_ranks_to_str`: split_group's group names."""
    return hashlib.sha1("_".join(map(str, ranks)).encode()).hexdigest()


@dataclass
class Mesh:
    """Dimensions outermost first (`("pp", 2), ("dp", 2), ("tp", 2)`): the last varies fastest in rank order."""

    dims: tuple[tuple[str, int], ...]
    hashed_names: bool = False  # split_group's names (NCCL, eager init) instead of new_group's counter
    mesh_descs: bool = True  # DeviceMesh's descriptions; plain new_group calls leave "undefined"
    grouped: tuple[str, ...] | None = None  # the dimensions the job makes groups of (None: every one, as DeviceMesh)
    groups: list[Group] = field(default_factory=list)  # in creation order, the world first

    def __post_init__(self) -> None:
        world = tuple(range(self.size))
        self.groups = [Group("0", "default_pg", world, WORLD)]
        counter = 1
        for dim in self.grouped_dims:
            for ranks in self.subgroups(dim):
                name = hashed_name(ranks) if self.hashed_names else str(counter)
                counter += 1
                desc = f"mesh_{dim}" if self.mesh_descs else "undefined"
                self.groups.append(Group(name, desc, ranks, dim))

    @property
    def grouped_dims(self) -> tuple[str, ...]:
        return self.dim_names if self.grouped is None else tuple(d for d in self.dim_names if d in self.grouped)

    @property
    def size(self) -> int:
        return math.prod(n for _, n in self.dims)

    @property
    def dim_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.dims)

    def coords(self, rank: int) -> dict[str, int]:
        found = {}
        for name, n in reversed(self.dims):
            found[name] = rank % n
            rank //= n
        return found

    def rank_at(self, coords: dict[str, int]) -> int:
        rank = 0
        for name, n in self.dims:
            rank = rank * n + coords[name]
        return rank

    def subgroups(self, dim: str) -> list[tuple[int, ...]]:
        """The groups of one dimension: ranks that agree on every other coordinate."""
        seen: dict[tuple, list[int]] = {}
        for rank in range(self.size):
            key = tuple(v for k, v in self.coords(rank).items() if k != dim)
            seen.setdefault(key, []).append(rank)
        return [tuple(ranks) for ranks in seen.values()]

    def group_of(self, rank: int, dim: str) -> Group:
        if dim == WORLD:
            return self.groups[0]
        return next(g for g in self.groups if g.dim == dim and rank in g.ranks)

    def groups_of(self, rank: int) -> list[Group]:
        """The groups this rank is a member of, in creation order: its process-local pg ids."""
        return [g for g in self.groups if rank in g.ranks]

    def pg_id(self, rank: int, group: Group) -> int:
        return self.groups_of(rank).index(group)

    def size_of(self, dim: str) -> int:
        return self.size if dim == WORLD else dict(self.dims)[dim]
