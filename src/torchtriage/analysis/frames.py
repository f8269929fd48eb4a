"""Telling the user's code from library code in a stack."""

from __future__ import annotations

# Paths of installed packages, the standard library and torch itself: never the user's line.
_LIBRARY_PATH_MARKERS = ("site-packages", "dist-packages", "/lib/python", "<frozen", "/torch/", "<string>")


def is_user_frame(path: str) -> bool:
    return not any(marker in path for marker in _LIBRARY_PATH_MARKERS)


def innermost_user_frame(traceback):
    """The last frame of `traceback.frames` (outermost first) that is the user's code, or None."""
    return next((frame for frame in reversed(traceback.frames) if is_user_frame(frame.path)), None)
