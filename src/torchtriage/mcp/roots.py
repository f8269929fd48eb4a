"""The folders an agent may have read: a path is admitted only when its real path lies inside one of them.

Symlinks are resolved before the check, and the resolved path is what the CLI is given, so a link cannot be
swapped between the check and the read; the CLI itself reads a folder's files only inside that folder.
A resolved path is absolute, so it can never be read as an option.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from torchtriage.errors import UsageError


class Refused(Exception):
    """A call the server will not hand to the CLI (a path outside the roots, live work not allowed): the message
    says why and what is allowed."""


@dataclass(frozen=True)
class Roots:
    folders: tuple[str, ...]  # real paths

    @classmethod
    def of(cls, folders: Iterable[str]) -> Roots:
        """The roots given on the command line (default: the working directory); each must be a folder."""
        resolved = []
        for folder in list(folders) or [os.getcwd()]:
            real = os.path.realpath(folder)
            if not os.path.isdir(real):
                raise UsageError(f"--root {folder}: not a folder; give folders the agent may read.")
            resolved.append(real)
        return cls(tuple(dict.fromkeys(resolved)))

    def admit(self, path: str) -> str:
        """The real path of `path` (relative to the working directory) if it lies inside a root."""
        if not isinstance(path, str) or not path.strip():
            raise Refused("an empty path; give a file or folder inside the server's roots.")
        try:
            real = os.path.realpath(os.path.join(os.getcwd(), path))
        except (ValueError, OSError) as err:  # a NUL byte, a name the file system cannot hold
            raise Refused(f"{path!r}: not a usable path ({err}).") from None
        if not any(_inside(real, root) for root in self.folders):
            raise Refused(
                f"{path!r} resolves to {real}, outside the folders this server may read "
                f"({', '.join(self.folders)}); start it with --root for another folder."
            )
        return real

    def admit_all(self, paths: Iterable[str]) -> list[str]:
        return [self.admit(path) for path in paths]


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # different drives
        return False
