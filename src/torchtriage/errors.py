"""Errors that reach the user as one clear message and an exit code, never as a traceback."""

from torchtriage import exit_codes


class TriageError(Exception):
    """A failure the user can act on: `str(err)` says what is wrong and what to do."""

    exit_code = exit_codes.BAD_INPUT


class InputError(TriageError):
    exit_code = exit_codes.BAD_INPUT


class UsageError(TriageError):
    exit_code = exit_codes.USAGE


class EnvironmentProblem(TriageError):
    exit_code = exit_codes.ENVIRONMENT
