"""torchtriage: diagnose failures of PyTorch distributed training and route each to the exact fix.

Offline analysis never imports torch, and importing this package stays cheap: the runtime helpers
below are imported only when first used (`from torchtriage import HangWatchdog`).
"""

__version__ = "0.1.0"

# Public name -> the module that defines it, imported on first access.
_LAZY_EXPORTS = {
    "HangWatchdog": "torchtriage.runtime.watchdog",
    "init_distributed": "torchtriage.runtime.setup",
    "store_wait": "torchtriage.runtime.setup",
    "store_set": "torchtriage.runtime.setup",
    "store_barrier": "torchtriage.runtime.setup",
    "set_env": "torchtriage.runtime.env",
    "assert_rank_uniform": "torchtriage.runtime.consensus",
    "RankDivergenceError": "torchtriage.runtime.consensus",
    "check_collectives": "torchtriage.runtime.fingerprint",
    "CollectiveMismatchError": "torchtriage.runtime.fingerprint",
    "NonFiniteGuard": "torchtriage.runtime.guard",
    "NonFiniteStepsError": "torchtriage.runtime.guard",
    "locate_nonfinite": "torchtriage.runtime.locate",
    "StepMonitor": "torchtriage.runtime.monitor",
    "StepMonitorCallback": "torchtriage.runtime.monitor",
    "LightningStepMonitor": "torchtriage.runtime.monitor",
    "compare_attention": "torchtriage.runtime.attention",
    "format_attention_report": "torchtriage.runtime.attention",
    "cuda_memory_history": "torchtriage.runtime.memory",
    "log_cuda_memory": "torchtriage.runtime.memory",
    "check_memory_margin": "torchtriage.runtime.memory",
    "install_oom_attribution": "torchtriage.runtime.memory",
    "oom_attribution": "torchtriage.runtime.memory",
    "profile_steps": "torchtriage.runtime.profiler",
    "phase": "torchtriage.runtime.profiler",
    "TorchProfilerCallback": "torchtriage.runtime.profiler",
    "record_flamegraphs": "torchtriage.runtime.profiler",
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
