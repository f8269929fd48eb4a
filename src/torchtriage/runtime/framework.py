"""Callbacks that are real subclasses of a training framework's base class, without importing it early.

`TorchProfilerCallback(...)` must be a real `transformers.TrainerCallback` (the Trainer checks), yet
importing torchtriage must not import transformers. `framework_instance` makes, once per class, a
subclass of the class and the framework's base, the first time an instance is created.
"""

from __future__ import annotations

import importlib
from typing import Any

_SUBCLASSES: dict[tuple[type, str], type] = {}


def framework_instance(cls: type, base_path: tuple[str, ...], needs: str):
    """A new instance of `cls` mixed with the first importable base in `base_path` ("module:Class")."""
    key = (cls, base_path[0])
    made = _SUBCLASSES.get(key)
    if made is None:
        base = None
        for path in base_path:
            module_name, _, class_name = path.partition(":")
            try:
                base = getattr(importlib.import_module(module_name), class_name)
                break
            except ImportError:
                continue
        if base is None:
            raise ImportError(f"{cls.__name__} needs {needs}")
        namespace: dict[str, Any] = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
        made = _SUBCLASSES[key] = type(cls.__name__, (cls, base), namespace)
    return object.__new__(made)
