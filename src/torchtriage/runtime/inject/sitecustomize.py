"""Injected by `torchtriage run` through PYTHONPATH: arms the hang watchdog in every training rank.

Python imports the first `sitecustomize` on its path at start-up; this one starts the watchdog in
processes that are ranks (RANK is set; the launcher's own agent has none), then hands over to the
sitecustomize that would otherwise have run, so the user's set-up is unchanged.

Only the process the launcher started is armed: its children (DataLoader workers started with spawn,
services it forks and execs) inherit RANK and the run folder too, and would otherwise each write a
rank's stacks and a verdict, even after the job is gone. The armed process notes its pid in the
environment its children inherit; a process that finds another pid there is a child.
"""

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ARMED_PID = "TORCHTRIAGE_ARMED_PID"


def _is_launched_rank():
    if not os.environ.get("TORCHTRIAGE_RUN_DIR") or os.environ.get("RANK") is None:
        return False
    armed = os.environ.get(_ARMED_PID)
    if armed and armed != str(os.getpid()):
        return False  # a child of an armed rank
    os.environ[_ARMED_PID] = str(os.getpid())
    return True


def _start_watchdog():
    # The names are torchtriage.protocol's; it is not importable yet (torchtriage may be found below).
    try:
        import torchtriage  # noqa: F401
    except ImportError:
        home = os.environ.get("TORCHTRIAGE_HOME")
        if home:
            sys.path.append(home)  # last, so it never shadows the user's own packages
    try:
        from torchtriage.runtime.identity import on_rank_start

        on_rank_start()  # first: it points the run folder at this attempt's, where the watchdog then writes
        from torchtriage.runtime.watchdog import start_from_environment

        start_from_environment()
        from torchtriage.runtime.gloo_exit import register

        register()  # the flight recorder `run` armed must not abort a gloo rank at exit (gloo_exit.py)
    except Exception as err:  # noqa: BLE001 - never stop a rank from starting
        print(f"torchtriage: the hang watchdog did not start: {type(err).__name__}: {err}", file=sys.stderr)


def _monitor_after_torch_import():
    """With `run --monitor`: start the step monitor once the program has imported torch itself.

    Importing torch here would slow every rank's start and run before the program's own set-up, so
    a finder waits for the program's `import torch` and starts the monitor when it has finished.
    """
    if not os.environ.get("TORCHTRIAGE_MONITOR_WINDOW"):
        return
    import importlib.abc

    class _AfterTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "torch":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec("torch")
            loader = getattr(spec, "loader", None)
            if loader is None or not hasattr(loader, "exec_module"):
                return spec
            original = loader.exec_module

            def exec_module(module):
                original(module)
                try:
                    from torchtriage.runtime.monitor import start_from_environment

                    start_from_environment()
                except Exception as err:  # noqa: BLE001 - never stop a rank from training
                    print(f"torchtriage: the step monitor did not start: {type(err).__name__}: {err}", file=sys.stderr)

            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _AfterTorch())


def _chain_to_next_sitecustomize():
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == _HERE:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_torchtriage_chained_sitecustomize", candidate)
            if spec and spec.loader:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


if _is_launched_rank():
    _start_watchdog()
    _monitor_after_torch_import()
_chain_to_next_sitecustomize()
