"""The walk of a folder: natural order, what is not a file said, and the same files and problems whether the tree
is walked whole here or cut into subtrees walked on other cores. Trees are generated from a seed: nested folders,
names of every shape (numbers, other scripts' digits, hidden names), empty files, links inside and out, dead links,
links to folders, FIFOs."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from torchtriage.sources import folder_walk, registry
from torchtriage.sources.registry import discover
from torchtriage.sources.streams import give_folder

NAME_PARTS = ("rank", "worker-", "x", "1", "07", "10", "²", "٣", "a", "", "log", ".", "_", "9" * 25)
CONTENTS = (b"", b"step 3 loss 2.5\n", b"[rank1]: RuntimeError: boom\n", b"\x00\x01\x02", b'{"step": 1}\n')


def _name(rng: random.Random) -> str:
    name = "".join(rng.choice(NAME_PARTS) for _ in range(rng.randint(1, 4))).strip(".") or "n"
    return name if rng.random() > 0.05 else "." + name  # a few hidden: never walked


def make_tree(root: Path, seed: int, outside: Path) -> None:
    """A tree of up to four levels of folders under `root`, with files, links and FIFOs of every kind."""
    rng = random.Random(seed)
    folders = [root]
    for _ in range(rng.randint(1, 40)):
        folder = rng.choice(folders) / _name(rng)
        if len(folder.relative_to(root).parts) <= 4 and not folder.exists():
            folder.mkdir()
            folders.append(folder)
    for _ in range(rng.randint(0, 120)):
        path = rng.choice(folders) / _name(rng)
        if path.exists() or path.is_symlink():
            continue
        roll = rng.random()
        if roll < 0.8:
            path.write_bytes(rng.choice(CONTENTS))
        elif roll < 0.86:
            path.symlink_to(outside)  # out of the folders given: named, not read
        elif roll < 0.9:
            path.symlink_to(root / "missing")  # dead
        elif roll < 0.95:
            path.symlink_to(rng.choice(folders))  # a folder inside: not walked twice
        else:
            os.mkfifo(path)


@pytest.mark.parametrize("seed", range(40))
def test_a_tree_cut_into_subtrees_gives_the_files_and_problems_of_the_whole_walk(tmp_path, seed):
    root, secret = tmp_path / "run", tmp_path / "secret.txt"
    root.mkdir()
    secret.write_text("token\n")
    make_tree(root, seed, secret)
    give_folder(str(root))
    whole_problems: list[str] = []
    whole = folder_walk.walk(str(root), whole_problems)
    for wanted in (2, 5, 1000):
        files, problems = [], []
        for kind, value in folder_walk.split(str(root), wanted=wanted):
            if kind == folder_walk.SUBTREE:
                files += folder_walk.walk(value, problems)
            elif kind == folder_walk.FILE:
                files.append(value)
            else:
                problems.append(value)
        assert (files, problems) == (whole, whole_problems), f"seed {seed}, wanted {wanted}"
    assert str(secret) not in whole and not any("/." in path for path in whole)


@pytest.mark.parametrize("seed", range(12))
def test_discovery_on_many_cores_is_discovery_on_one(tmp_path, seed, monkeypatch):
    root, secret = tmp_path / "run", tmp_path / "secret.txt"
    root.mkdir()
    secret.write_text("token\n")
    make_tree(root, 1000 + seed, secret)
    monkeypatch.setattr(registry, "usable_cores", lambda: 1)
    one_problems: list[str] = []
    on_one = discover([str(root)], one_problems)
    monkeypatch.setattr(registry, "usable_cores", lambda: 3)  # children even on a machine of one core
    many_problems: list[str] = []
    assert discover([str(root)], many_problems) == on_one
    assert many_problems == one_problems


def test_names_whose_text_is_another_scripts_digits_sort_beside_the_others(tmp_path):
    # "²" is a digit to str.isdigit but not to a regex's \d: a key that made it a number beside a name whose same
    # place is text compared a number with a string, and triage of the folder ended in an internal error.
    for name in ("1²", "1a", "٣x", "rank10.log", "rank2.log"):
        (tmp_path / name).write_text("step 1 loss 2.0\n")
    found = discover([str(tmp_path)], [])
    assert [os.path.basename(i.path) for i in found] == ["1a", "1²", "٣x", "rank2.log", "rank10.log"]
