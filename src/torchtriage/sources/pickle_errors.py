"""What goes wrong reading a pickle from another machine, for the readers that share it (the restricted
unpickler, the bounds scan before it, the streaming reader)."""


class PickleError(ValueError):
    """The data could not be unpickled safely; the message says why."""


class PickleRefused(PickleError):
    """The pickle names a global (a class or function), which plain data never needs."""


class PickleCorrupt(PickleError):
    """The pickle is empty, truncated or not a pickle at all."""
