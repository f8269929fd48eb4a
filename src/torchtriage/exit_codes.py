"""Exit codes shared by every command (documented in `torchtriage --help` and the README)."""

OK = 0  # ran and found nothing wrong, or the check passed
PROBLEM_FOUND = 1  # ran and diagnosed a problem, or the check failed
USAGE = 2  # the command line is wrong
BAD_INPUT = 3  # the input is unreadable or malformed
ENVIRONMENT = 4  # this environment cannot support the operation (no ptrace, a tool missing, ...)

HELP = """exit codes:
  0  ran and found nothing wrong (or the check passed)
  1  ran and diagnosed a problem (or the check failed)
  2  usage error
  3  input unreadable or malformed
  4  the environment cannot support the operation (ptrace not permitted, a tool missing)"""
