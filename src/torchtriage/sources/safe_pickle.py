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
import pickle
from collections.abc import Iterator
from typing import Any

from torchtriage.sources.pickle_errors import PickleCorrupt, PickleError, PickleRefused
from torchtriage.sources.pickle_scan import scan

__all__ = ["PickleError", "PickleRefused", "PickleCorrupt", "safe_loads", "safe_load_file", "unpickle_with_memo"]


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:  # noqa: D102 - see the module docstring
        raise PickleRefused(
            f"it asks to load `{module}.{name}`, which plain data never needs; refused without running anything "
            "(a genuine dump holds only dicts, lists, strings and numbers: was the file replaced or tampered with?)"
        )

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        raise PickleRefused("it refers to an external object (a persistent id), which plain data never needs; refused")


class _WholeBuffer:
    """The bytes of a pickle as the C unpickler's input, never copied.

    With `peek`, the unpickler takes everything that peek returns as its buffer and later calls `read` only
    to move past what it used, dropping the result; a memoryview serves both without copying. (Through
    `io.BufferedReader(io.BytesIO(data))`, the bytes were copied three times: a third of the load time.)"""

    __slots__ = ("_data", "_view", "_at")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._view = memoryview(data)
        self._at = 0

    def peek(self, size: int = 0) -> memoryview:
        return self._view[self._at :]

    def read(self, size: int = -1) -> memoryview:
        start = self._at
        self._at = len(self._view) if size < 0 else min(start + size, len(self._view))
        return self._view[start : self._at]

    def readinto(self, buffer: Any) -> int:
        chunk = self.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)

    def readline(self) -> bytes:  # the text opcodes of protocol 0
        start = self._at
        self._at = self._data.find(b"\n", start) + 1 or len(self._data)
        return self._data[start : self._at]


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
    return _load(data, keep_memo=False)[0]


def unpickle_with_memo(data: bytes) -> tuple[Any, dict[int, Any]]:
    """`safe_loads`, and the memo the pickle filled (slot -> value): what a later stream's memo reads would get."""
    return _load(data, keep_memo=True)


def _load(data: bytes, keep_memo: bool) -> tuple[Any, dict[int, Any]]:
    if not data:
        raise PickleCorrupt("the file is empty")
    scan(data)  # what the C unpickler would build, bounded before it builds it
    try:
        with collector_paused():
            unpickler = _PlainDataUnpickler(_WholeBuffer(data))  # type: ignore[arg-type]
            value = unpickler.load()
            memo = unpickler.memo.copy() if keep_memo else {}
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
    return value, memo


def safe_load_file(path: str) -> Any:
    """Read and safely unpickle a file (OSError propagates to the caller, who names the file)."""
    with open(path, "rb") as handle:
        return safe_loads(handle.read())
