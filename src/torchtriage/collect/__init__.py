"""Live collectors: the only code in torchtriage that touches running processes.

    discovery  find the ranks on this node (torchrun agents' workers, or the pids the user names)
    preflight  decide, before attaching, whether ptrace can work here (Yama scope, CAP_SYS_PTRACE, uid)
    pyspy      find py-spy and run it on many processes at once, bounded, leaving no tracer behind
    capture    the whole capture (discover, check, run py-spy, write the folder and summary.json), as
               used by `torchtriage dump`, `torchtriage record` and `torchtriage diagnose`

They are careful guests: every py-spy is bounded by a timeout and killed (with its child processes
waited for) on a timeout or Ctrl-C; no signal is ever sent to a training rank.
"""
