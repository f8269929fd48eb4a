"""torchtriage: diagnose failures of PyTorch distributed training and route each to the exact fix.

Offline analysis never imports torch, and importing this package stays cheap: the runtime helpers
below are imported only when first used (`from torchtriage import HangWatchdog`).
"""

__version__ = "0.1.0"

# Public name -> the module that defines it, imported on first access.
_LAZY_EXPORTS = {
    "HangWatchdog": "torchtriage.runtime.watchdog",
}

__all__ = ["__version__", *_LAZY_EXPORTS]


def __getattr__(name: str):
    module_name = _LAZY_EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'torchtriage' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
