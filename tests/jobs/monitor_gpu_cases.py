"""The cases `monitor_gpu_job.py` plays and what the step monitor must decide of each (rank 1 is made slow).

One table for the job, its recorder (`tests/gpu/record_monitor_gpu.py`) and the test that replays the
recordings (`tests/test_monitor_gpu.py`). A case's decision is (kind, rank, reason); None: nothing may be
decided at all.
"""

SLOW_RANK = 1
EXPECTED = {
    "data": ("straggler", SLOW_RANK, "data"),  # its batches come 30 ms later
    "compute": ("straggler", SLOW_RANK, "compute"),  # it runs its forward twice
    "launch": ("straggler", SLOW_RANK, "launch"),  # its host busy-waits between the forward's blocks
    "even": None,
    "loss10": ("straggler", SLOW_RANK, "data"),  # as data, in a loop that reads its loss every tenth step
}
