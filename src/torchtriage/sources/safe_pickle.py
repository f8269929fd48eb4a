"""A restricted unpickler for artifacts that come from other machines (flight-recorder dumps, memory snapshots).

A pickle is a program: `pickle.load` runs whatever callable the data names. The artifacts we read hold
only plain data (dicts, lists, tuples, sets, strings, bytes, numbers, booleans, None), which the pickle
machine builds from opcodes alone without ever naming a global. So every global is refused, and with it
every way a pickle can call code (REDUCE, BUILD, NEWOBJ, INST, OBJ, EXT* all need a callable that only
`find_class` can supply); persistent ids are refused too. What is left cannot run code.

Errors say what was wrong with the data: truncated, corrupt, or hostile.
"""

from __future__ import annotations

import contextlib
import gc
import io
import pickle
from collections.abc import Iterator
from typing import Any

__all__ = ["PickleError", "PickleRefused", "PickleCorrupt", "safe_loads", "safe_load_file"]

# The C unpickler prefetches only from a stream with peek(); without it, it reads opcode by opcode.
_BUFFER = 1 << 20


class PickleError(ValueError):
    """The data could not be unpickled safely; the message says why."""


class PickleRefused(PickleError):
    """The pickle names a global (a class or function), which plain data never needs."""


class PickleCorrupt(PickleError):
    """The pickle is empty, truncated or not a pickle at all."""


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:  # noqa: D102 - see the module docstring
        raise PickleRefused(
            f"it asks to load `{module}.{name}`, which plain data never needs; refused without running anything "
            "(a genuine dump holds only dicts, lists, strings and numbers: was the file replaced or tampered with?)"
        )

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        raise PickleRefused("it refers to an external object (a persistent id), which plain data never needs; refused")


TRUNCATED = "the pickle is truncated: it ends before its STOP opcode (cut off while being written or copied?)"


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Plain data has no reference cycles for the collector to find, and building millions of containers
    would trigger it over and over, each time walking everything built so far (it triples the load time
    of a large dump)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def safe_loads(data: bytes) -> Any:
    """Unpickle `data`, allowing only plain containers and scalars."""
    if not data:
        raise PickleCorrupt("the file is empty")
    # A buffer no larger than the data: allocating (and touching) a megabyte for a 40 KB dump costs 10%.
    size = max(io.DEFAULT_BUFFER_SIZE, min(len(data), _BUFFER))
    stream = io.BufferedReader(io.BytesIO(data), size)  # type: ignore[arg-type]
    try:
        with collector_paused():
            value = _PlainDataUnpickler(stream).load()
    except PickleError:
        raise
    except EOFError:
        raise PickleCorrupt(TRUNCATED) from None
    except pickle.UnpicklingError as err:
        reason = str(err)
        if "truncated" in reason:
            raise PickleCorrupt(
                "the pickle is truncated: it ends in the middle of a value (cut off while being written or copied?)"
            ) from None
        raise PickleCorrupt(f"not a valid pickle ({reason})") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, MemoryError, OverflowError) as err:
        # Opcodes in an impossible order (corruption) surface as ordinary exceptions from the pickle machine.
        raise PickleCorrupt(f"the pickle is corrupt ({type(err).__name__}: {err})") from None
    return value


def safe_load_file(path: str) -> Any:
    """Read and safely unpickle a file (OSError propagates to the caller, who names the file)."""
    with open(path, "rb") as handle:
        return safe_loads(handle.read())
