"""How the verdict is reasoned, on logs written from the real message formats."""

from conftest import triage_json
from torchtriage import exit_codes

OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of "
    "79.19 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.16 GiB memory in use. "
    "Of the allocated memory 75.11 GiB is allocated by PyTorch, and 1.32 GiB is reserved by PyTorch but unallocated."
)
WATCHDOG = (
    "[PG ID 0 PG GUID 0(default_pg) Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812, "
    "OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600043 milliseconds before "
    "timing out."
)


def write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_oom_that_came_first_is_the_cause_and_the_peers_timeouts_its_aftermath(tmp_path):
    write(tmp_path, "rank0.log", [f"[E1130 10:20:05.000000000 ProcessGroupNCCL.cpp:689] {WATCHDOG.format(rank=0)}"])
    write(tmp_path, "rank3.log", [f"[E1130 10:10:01.000000000 train.py:88] {OOM}"])
    write(tmp_path, "rank5.log", [f"[E1130 10:20:06.000000000 ProcessGroupNCCL.cpp:689] {WATCHDOG.format(rank=5)}"])
    code, verdict = triage_json(tmp_path)
    assert (code, verdict["category"], verdict["culprit_ranks"]) == (exit_codes.PROBLEM_FOUND, "oom", [3])
    assert verdict["facts"]["order_basis"] == "the only cause"  # the timeouts are symptoms: no order to decide
    roles = {f["kind"]: f["role"] for f in verdict["findings"]}
    assert roles["nccl.watchdog_timeout"] == "symptom"
    assert verdict["findings"][0]["kind"].startswith("oom.")


def test_a_launch_failure_on_a_peer_of_an_oom_rank_is_collateral(tmp_path):
    write(tmp_path, "rank1.log", ["RuntimeError: CUDA error: unspecified launch failure"])
    write(tmp_path, "rank2.log", [OOM])
    code, verdict = triage_json(tmp_path)
    assert verdict["category"] == "oom" and verdict["culprit_ranks"] == [2]
    roles = {f["kind"]: f["role"] for f in verdict["findings"]}
    assert roles["gpu_fault.launch_failure"] == "collateral"


def test_without_comparable_times_across_files_the_verdict_says_so(tmp_path):
    write(tmp_path, "rank1.log", ["RuntimeError: CUDA error: an illegal memory access was encountered"])
    write(tmp_path, "rank2.log", ["RuntimeError: CUDA error: an illegal memory access was encountered"])
    code, verdict = triage_json(tmp_path)
    assert verdict["category"] == "gpu_fault" and verdict["culprit_ranks"] == [1, 2]
    assert any("could not be established" in p for p in verdict["problems"])


def test_watchdog_timeouts_alone_do_not_blame_the_ranks_that_waited(tmp_path):
    write(
        tmp_path,
        "job.log",
        [f"[rank{r}]:[E1130 10:20:0{r}.0 ProcessGroupNCCL.cpp:689] " + WATCHDOG.format(rank=r) for r in (0, 1, 2)],
    )
    code, verdict = triage_json(tmp_path / "job.log")
    assert verdict["category"] == "nccl_timeout"
    assert verdict["culprit_ranks"] == []  # rank 3 never printed: it is the suspect, not 0-2
    assert verdict["facts"]["seq"] == "812" and verdict["facts"]["timeout_ms"] == "600000"
    assert verdict["facts"]["numel_in"] == "1048576"


def test_the_one_rank_below_the_highest_that_never_timed_out_is_the_culprit_at_medium(tmp_path):
    # A rank that never reached the collective has nothing to time out on: its watchdog times only what it
    # enqueued. Among ranks 0-7, the silent rank 3 is it; two silent ranks are candidates. Read from an absence
    # (its output may be missing), never high.
    for silent, culprits, candidates in (({3}, [3], None), ({3, 5}, [], [3, 5])):
        lines = [
            f"[rank{r}]:[E1130 10:20:0{r}.0 ProcessGroupNCCL.cpp:689] " + WATCHDOG.format(rank=r) for r in range(8)
        ]
        write(tmp_path, "job.log", [line for r, line in enumerate(lines) if r not in silent])
        verdict = triage_json(tmp_path / "job.log")[1]
        assert (verdict["culprit_ranks"], verdict["confidence"]) == (culprits, "medium"), verdict["summary"]
        assert verdict["facts"].get("candidates") == candidates


def test_sizes_name_the_departed_rank_only_where_the_op_has_one_size_and_every_other_rank_agrees(tmp_path):
    # An all_reduce has one size on every rank: the one rank of five with another size departed. An
    # all_to_all_single's ranks each send their own split, a coalesced op sums each rank's own batch: sizes that
    # differ say nothing. Three sizes among five ranks: no two sides agree, no rank is singled out.
    def timeouts(op, sizes):
        return [
            f"[rank{r}]:[E1130 10:20:0{r}.0 ProcessGroupNCCL.cpp:689] [PG ID 0 PG GUID 0(default_pg) Rank {r}] "
            f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum=77, OpType={op}, NumelIn={n}, "
            f"NumelOut={n}, Timeout(ms)=600000) ran for 600043 milliseconds before timing out."
            for r, n in enumerate(sizes)
        ]

    cases = (
        ("ALLREDUCE", (8, 8, 4096, 8, 8), [2], "high"),
        ("ALLTOALL_BASE", (8, 8, 4096, 8, 8), [], None),
        ("COALESCED", (8, 8, 4096, 8, 8), [], None),
        ("ALLREDUCE", (1, 1, 4096, 1048576, 1048576), [], None),
    )
    for op, sizes, culprits, confidence in cases:
        write(tmp_path, "job.log", timeouts(op, sizes))
        verdict = triage_json(tmp_path / "job.log")[1]
        assert verdict["category"] == "nccl_timeout"
        assert verdict["culprit_ranks"] == culprits, (op, sizes, verdict["summary"])
        if confidence:
            assert verdict["confidence"] == confidence
        else:
            assert "size mismatch" not in verdict["summary"] or "cannot tell" in verdict["summary"]


def test_a_loss_scale_every_rank_shares_names_no_rank_by_who_logged_it_or_exited_first(tmp_path):
    # DeepSpeed logs "OVERFLOW! Rank 0" on rank 0 only (deepspeed/runtime/fp16/loss_scaler.py), and every rank
    # raises at the minimum scale at once: rank 0's line, or the rank torchrun saw exit first, is no culprit.
    overflow = (
        "[2025-03-02 08:11:0{n},233] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 "
        "Skipping step. Attempted loss scale: {a}, reducing to {b}"
    )
    lines = [overflow.format(n=n, a=2 ** (4 - n), b=2 ** (3 - n)) for n in range(4)] + [
        "Traceback (most recent call last):",
        '  File "/opt/conda/lib/python3.10/site-packages/deepspeed/runtime/fp16/loss_scaler.py", line 183, in '
        "update_scale",
        "    raise Exception(",
        "Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.",
        "[2025-03-02 08:11:09,554] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1) "
        "local_rank: 6 (pid: 2981127) of binary: /usr/bin/python3",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2025-03-02_08:11:09",
        "  host      : gpu-a",
        "  rank      : 6 (local_rank: 6)",
        "  exitcode  : 1 (pid: 2981127)",
    ]
    write(tmp_path, "job.log", lines)
    verdict = triage_json(tmp_path / "job.log")[1]
    assert (verdict["category"], verdict["culprit_ranks"]) == ("nan_inf", []), verdict["summary"]
    assert "every rank shares" in verdict["summary"]


def test_a_silent_rank_below_ranks_that_no_job_size_ends_is_said_at_low_and_a_known_world_widens_it(tmp_path):
    # Ranks 0, 2-4 timed out: five ranks are no job on whole nodes (a node holds 1, 2, 4 or 8 GPUs), so ranks above
    # 4 may be as silent as rank 1. NCCL's world communicator (src/init.cc "comm %p rank %d nranks %d ... Init
    # COMPLETE") saying eight ranks makes ranks 1, 5-7 the candidates.
    header = "[E1130 10:20:00.0 ProcessGroupNCCL.cpp:689] "
    lines = [f"[rank{r}]:{header}" + WATCHDOG.format(rank=r) for r in (0, 2, 3, 4)]
    write(tmp_path, "job.log", lines)
    verdict = triage_json(tmp_path / "job.log")[1]
    assert (verdict["culprit_ranks"], verdict["confidence"]) == ([1], "low"), verdict["summary"]
    assert any("taken to be 5" in doubt for doubt in verdict["facts"]["doubts"])
    init = "[rank0]:gpu-a:4121:4190 [0] NCCL INFO comm 0x55d1c2a0b3f0 rank 0 nranks 8 cudaDev 0 busId 18000 - Init "
    init += "COMPLETE"
    write(tmp_path, "job.log", [init, *lines])
    verdict = triage_json(tmp_path / "job.log")[1]
    assert (verdict["culprit_ranks"], verdict["facts"].get("candidates")) == ([], [1, 5, 6, 7]), verdict["summary"]


def test_a_rank_that_printed_only_info_chatter_no_rule_reads_is_as_silent_as_one_that_printed_nothing(tmp_path):
    # Ranks 1-3 timed out; rank 0 printed NCCL's set-up chatter ("Connected all rings", logged at INFO, a line with a
    # rule's anchor that no rule reads) and its step lines, nothing of the failure: it never reached the collective.
    header = "[E1130 10:20:00.0 ProcessGroupNCCL.cpp:689] "
    chatter = "gpu-a:4121:4190 [0] NCCL INFO Connected all rings"
    timeouts = [f"[rank{r}]:{header}" + WATCHDOG.format(rank=r) for r in (1, 2, 3)]
    verdict = triage_json(write(tmp_path, "job.log", [f"[rank0]:{chatter}", "[rank0]:step 10 loss 2.1", *timeouts]))[1]
    assert (verdict["culprit_ranks"], verdict["confidence"]) == ([0], "medium"), verdict["summary"]
    # the same in per-rank files, rank 0's named by its file only
    (tmp_path / "ranks").mkdir()
    write(tmp_path / "ranks", "rank0.log", [chatter])
    for r in (1, 2, 3):
        write(tmp_path / "ranks", f"rank{r}.log", [header + WATCHDOG.format(rank=r)])
    verdict = triage_json(tmp_path / "ranks")[1]
    assert (verdict["culprit_ranks"], verdict["confidence"]) == ([0], "medium"), verdict["summary"]
    # a line of another level that could match, read by no rule, is a report of its own: the silence is not decided
    warned = "[rank0]:[W1130 10:19:00.0 train.py:3] NCCL WARN Connected all rings"
    verdict = triage_json(write(tmp_path, "job.log", [f"[rank0]:{chatter}", warned, *timeouts]))[1]
    assert verdict["culprit_ranks"] == [], verdict["summary"]


def test_a_rank_whose_watchdog_timed_out_in_an_earlier_collective_than_the_majority_is_behind(tmp_path):
    # Without status lines (torch < 2.2 prints no counters) each rank's watchdog still names the oldest collective
    # it enqueued that never completed: the majority completed seq 2200 and waits in 2201 for rank 3, still in 2200.
    def timed_out(rank, seq):
        return (
            f"[rank{rank}]:[E0120 03:10:0{rank}.1 ProcessGroupNCCL.cpp:475] [Rank {rank}] Watchdog caught collective "
            f"operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1806432 "
            "milliseconds before timing out."
        )

    lines = [timed_out(r, 2200 if r == 3 else 2201) for r in range(4)]
    verdict = triage_json(write(tmp_path, "job.log", lines))[1]
    assert (verdict["culprit_ranks"], verdict["confidence"]) == ([3], "medium"), verdict["summary"]
    # Ahead of the majority names nobody (it only queued more behind the op it waits in); two against two is even.
    for seqs in ({0: 2201, 1: 2201, 2: 2201, 3: 2202}, {0: 2200, 1: 2200, 2: 2201, 3: 2201}):
        verdict = triage_json(write(tmp_path, "job.log", [timed_out(r, s) for r, s in seqs.items()]))[1]
        assert verdict["culprit_ranks"] == [], (seqs, verdict["summary"])


def test_a_rank_torchruns_report_shows_only_as_closed_by_sigterm_is_the_silent_one(tmp_path):
    # torchrun's agent sends SIGTERM to the workers still running once one failed ("Sending process P closing
    # signal SIGTERM"), and its report lists them with exitcode -15: a rank known only so was alive, and timed out
    # on nothing, while its peers timed out in the collective (torch/distributed/elastic/multiprocessing/api.py).
    header = "[E1130 10:20:00.0 ProcessGroupNCCL.cpp:689] "
    timeouts = [f"[rank{r}]:{header}" + WATCHDOG.format(rank=r) for r in (0, 2, 3)]

    def entry(rank, code):
        signal = ["  traceback : Signal 15 (SIGTERM) received by PID 801"] if code == -15 else []
        return [
            f"[{rank}]:",
            "  time      : 2025-09-10_10:30:01",
            "  host      : gpu-u01",
            f"  rank      : {rank} (local_rank: {rank})",
            f"  exitcode  : {code} (pid: {800 + rank})",
            *signal,
        ]

    report = ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "=" * 60, "train.py FAILED"]
    report += ["-" * 60, "Failures:", *entry(2, 1), *entry(1, -15), "-" * 60]
    report += ["Root Cause (first observed failure):", *entry(0, 1), "=" * 60]
    verdict = triage_json(write(tmp_path, "job.log", timeouts + report))[1]
    assert (verdict["culprit_ranks"], verdict["confidence"]) == ([1], "medium"), verdict["summary"]
    assert "running when the agent closed the workers" in verdict["summary"]
    # The same rank with a failure line of its own is no silent rank.
    oom = f"[rank1]:[E1130 10:20:09.0 train.py:88] {OOM}"
    verdict = triage_json(write(tmp_path, "job.log", timeouts + [oom] + report))[1]
    assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", [1])


def test_the_one_rank_that_failed_on_its_own_while_the_others_timed_out_leads(tmp_path):
    # aten/src/ATen/cuda/Exceptions.h TORCH_CUDABLAS_CHECK: rank 4's GEMM failed, so it never reached the all-reduce
    # its seven peers then timed out in. The timeouts carry timestamps and a higher priority; its error leads.
    cublas = (
        "[rank4]:RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, opa)`"
    )
    waiting = [f"[rank{r}]:[E1130 10:20:0{r}.0 ProcessGroupNCCL.cpp:689] " + WATCHDOG.format(rank=r) for r in range(8)]
    write(tmp_path, "job.log", [cublas, *(line for r, line in enumerate(waiting) if r != 4)])
    verdict = triage_json(tmp_path / "job.log")[1]
    assert (verdict["category"], verdict["culprit_ranks"]) == ("gpu_fault", [4]), verdict["summary"]
    # A rank that timed out too was in the collective: the timeout's readings decide as before.
    write(tmp_path, "job.log", [cublas, *waiting])
    assert triage_json(tmp_path / "job.log")[1]["category"] == "nccl_timeout"


def test_the_one_rank_that_crashed_while_the_others_lost_a_peer_is_it_not_a_silent_rank(tmp_path):
    # ProcessGroupNCCL's async error on ranks 0-7 (a peer gone), CPython's fatal error handler on rank 9; rank 8
    # printed nothing. The peer that went is the one that crashed, not the one that kept quiet.
    remote = (
        "[rank{r}]:[E0211 17:40:06.3 ProcessGroupNCCL.cpp:1591] [Rank {r}] Collective WorkNCCL(SeqNum=5512, "
        "OpType=ALLGATHER, NumelIn=4096, NumelOut=4096, Timeout(ms)=600000) raised the following async exception: "
        "NCCL error: remote process exited or there was a network error, NCCL version 2.21.5"
    )
    write(
        tmp_path, "job.log", ["[rank9]:Fatal Python error: Segmentation fault", *(remote.format(r=r) for r in range(8))]
    )
    verdict = triage_json(tmp_path / "job.log")[1]
    assert verdict["culprit_ranks"] == [9], verdict["summary"]


def test_the_watchdogs_either_an_error_or_timeout_line_yields_to_the_line_that_says_which(tmp_path):
    # ProcessGroupNCCL.cpp: the status line of any failed work, and the async error of the same work (a peer gone).
    status = "[rank{r}]:[E0211 17:40:06.3 ProcessGroupNCCL.cpp:1632] [PG 0 (default_pg) Rank {r}] Exception (either an "
    status += "error or timeout) detected by watchdog at work: 40211, last enqueued NCCL work: 40211, last completed "
    status += "NCCL work: 40210."
    remote = (
        "[rank{r}]:[E0211 17:40:06.3 ProcessGroupNCCL.cpp:1591] [Rank {r}] Collective WorkNCCL(SeqNum=40211, "
        "OpType=ALLREDUCE, NumelIn=67108864, NumelOut=67108864, Timeout(ms)=600000) raised the following async "
        "exception: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5"
    )
    lines = [line.format(r=r) for r in range(4) for line in (remote, status)]
    write(tmp_path, "job.log", lines)
    assert triage_json(tmp_path / "job.log")[1]["category"] == "nccl_transport"
    write(
        tmp_path,
        "job.log",
        [
            *lines,
            *(f"[rank{r}]:[E0211 17:40:06.3 ProcessGroupNCCL.cpp:689] " + WATCHDOG.format(rank=r) for r in range(4)),
        ],
    )
    assert triage_json(tmp_path / "job.log")[1]["category"] == "nccl_timeout"


def test_rank0_can_be_the_culprit(tmp_path):
    lines = [
        "[rank1]:[E1130 10:20:01.0 ProcessGroupNCCL.cpp:2303] [PG ID 0 PG GUID 0(default_pg) Rank 1]  failure "
        "detected by watchdog at work sequence id: 812 PG status: last enqueued work: 812, last completed work: 811",
        "[rank2]:[E1130 10:20:01.5 ProcessGroupNCCL.cpp:2303] [PG ID 0 PG GUID 0(default_pg) Rank 2]  failure "
        "detected by watchdog at work sequence id: 812 PG status: last enqueued work: 812, last completed work: 811",
        "[rank0]:[E1130 10:20:02.0 ProcessGroupNCCL.cpp:1914] [PG ID 0 PG GUID 0(default_pg) Rank 0] Received a dump "
        "signal due to a collective timeout from  rank 1 and we will try our best to dump the debug info. Last "
        "enqueued NCCL work: 811, last completed NCCL work: 811.",
    ]
    code, verdict = triage_json(write(tmp_path, "job.log", lines))
    assert verdict["culprit_ranks"] == [0]
    assert verdict["facts"]["last_enqueued_by_rank"] == {"0": 811, "1": 812, "2": 812}


def test_a_log_that_stops_after_nccl_init_is_a_hang_unless_it_went_on(tmp_path):
    init = "node1:100:200 [0] NCCL INFO comm 0x5566 rank 0 nranks 8 cudaDev 0 busId 1b000 - Init COMPLETE"
    code, verdict = triage_json(write(tmp_path, "stuck.log", ["NCCL version 2.21.5+cuda12.4", init]))
    assert (code, verdict["category"], verdict["confidence"]) == (exit_codes.PROBLEM_FOUND, "hang", "low")
    done = "node1:100:100 [0] NCCL INFO comm 0x5566 rank 0 nranks 8 cudaDev 0 busId 1b000 - Destroy COMPLETE"
    code, verdict = triage_json(write(tmp_path, "clean.log", [init, "step 1 loss 2.0", done]))
    assert (code, verdict["findings"]) == (exit_codes.OK, [])


def test_a_straggler_report_names_the_slow_rank_only_when_the_spread_is_large(tmp_path):
    report = (
        "INFO:megatron.core.utils:[2026-11-30 04:10:02] | MnRtt/Rnk: 1410.22ms/5 | MxRtt/Rnk: {slow}ms/12 | "
        "MnPwr/Rnk: 601796W/12 | MxPwr/Rnk: 683801W/3"
    )
    code, verdict = triage_json(write(tmp_path, "slow.log", [" 0: " + report.format(slow="1873.90")]))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("straggler", [12])
    assert any((a["command"] or "").startswith("torchtriage trace") for a in verdict["actions"])
    code, verdict = triage_json(write(tmp_path, "even.log", [" 0: " + report.format(slow="1450.00")]))
    # An even report names no straggler; a log that ends on it shows no error, only where it stops.
    assert not any(f["kind"].startswith("straggler") for f in verdict["findings"])
    assert (verdict["culprit_ranks"], verdict["confidence"]) == ([], "low")


def test_stdin_with_srun_labels_and_colour(tmp_path):
    text = f"\x1b[31m 7: {OOM}\x1b[0m\r\n 2: step 10 loss 1.0\r\n".encode()
    code, verdict = triage_json("-", stdin=text)
    assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", [7])
    assert verdict["sources"] == ["<stdin>"]


def test_a_pasted_stack_without_a_rank_that_ends_inside_a_collective_is_a_hang(tmp_path):
    # A user pastes the stack of a stuck job: no rank prefix, no exception line, the last frame a collective.
    site = "/venv/lib/python3.11/site-packages"
    write(
        tmp_path,
        "stuck.log",
        [
            "Traceback (most recent call last):",
            '  File "/home/me/train.py", line 120, in <module>',
            "    trainer.fit(model)",
            '  File "/home/me/train.py", line 88, in save',
            "    torch.distributed.barrier()",
            f'  File "{site}/torch/distributed/c10d_logger.py", line 83, in wrapper',
            "    return func(*args, **kwargs)",
            f'  File "{site}/torch/distributed/distributed_c10d.py", line 4811, in barrier',
        ],
    )
    code, verdict = triage_json(tmp_path / "stuck.log")
    assert (code, verdict["category"]) == (exit_codes.PROBLEM_FOUND, "hang")
    assert verdict["findings"][0]["kind"] == "hang.stack_in_collective"
    assert "barrier" in verdict["findings"][0]["evidence"][0]["text"]


def test_an_exception_ignored_in_a_destructor_is_never_the_cause(tmp_path):
    lines = [
        "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f3a0e2b1c40>",
        "Traceback (most recent call last):",
        '  File "/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 1477, in __del__',
        "    self._shutdown_workers()",
        "AttributeError: '_MultiProcessingDataLoaderIter' object has no attribute '_workers_status'",
        f"[rank1]: {OOM}",
    ]
    code, verdict = triage_json(write(tmp_path, "job.log", lines))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", [1])
    ignored = next(f for f in verdict["findings"] if "AttributeError" in f["message"])
    assert ignored["role"] == "collateral"


def test_a_line_logged_at_info_level_reports_and_does_not_decide(tmp_path):
    # The same words a failing rank would print, logged at INFO by a component that only reports them.
    info = "INFO:trainer:RuntimeError: CUDA error: an illegal memory access was encountered (retrying)"
    code, verdict = triage_json(write(tmp_path, "job.log", [info, f"[rank2]: {OOM}"]))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", [2])


def test_a_rankless_assertion_takes_the_rank_of_the_line_that_reports_it(tmp_path):
    lines = [
        "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:93: operator(): block: [211,0,0], thread: [64,0,0] "
        'Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.',
        "[rank1]: RuntimeError: CUDA error: device-side assert triggered",
    ]
    code, verdict = triage_json(write(tmp_path, "job.log", lines))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("gpu_fault", [1])


def test_rank_prefixes_behind_host_and_ray_prefixes_are_read(tmp_path):
    lines = [
        f"10.0.0.5: [rank19]: {OOM}",
        f"(RayTrainWorker pid=4242, ip=10.0.0.6) [rank3]:[E1130 10:20:05.000000000 ProcessGroupNCCL.cpp:689] "
        f"{WATCHDOG.format(rank=3)}",
    ]
    code, verdict = triage_json(write(tmp_path, "job.log", lines))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", [19])
    assert 3 in verdict["facts"]["ranks_seen"]


def test_more_workers_than_the_world_at_the_store_barrier_is_two_jobs_fewer_is_a_missing_rank(tmp_path):
    line = (
        "RuntimeError: Timed out initializing process group in store based barrier on rank: 0, for key: "
        "store_based_barrier_key:1 (world_size=8, worker_count={joined}, timeout=0:30:00)"
    )
    code, verdict = triage_json(write(tmp_path, "two.log", [line.format(joined=16)]))
    assert verdict["findings"][0]["kind"] == "rendezvous.store_barrier_two_jobs"
    code, verdict = triage_json(write(tmp_path, "missing.log", [line.format(joined=7)]))
    assert "rendezvous.store_barrier_two_jobs" not in [f["kind"] for f in verdict["findings"]]


def test_the_ranks_a_report_names_as_behind_are_the_culprits(tmp_path):
    barrier = "[Rank 0] Ranks 2, 5 failed to pass monitoredBarrier in 30000 ms"
    code, verdict = triage_json(write(tmp_path, "barrier.log", [barrier]))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("hang", [2, 5])
    # Horovod lists the ranks that are ready: the others, of those the log shows, are behind.
    lines = [f"[1,{r}]<stderr>:step 12 loss 2.0" for r in range(4)] + [
        "[1,0]<stderr>:Stalled ops: DistributedAdam_Allreduce/HorovodAllreduce_dense_0 [ready ranks: 0, 1, 3]"
    ]
    code, verdict = triage_json(write(tmp_path, "horovod.log", lines))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("hang", [2])


def test_a_rank_that_waited_for_others_is_not_named_for_reporting_it(tmp_path):
    # Rules marked printer_waits: the printing rank timed out waiting (a store-based barrier, a store key, the NCCL
    # unique id from rank 0), so it reports the failure; the ranks the line names as missing are the culprits.
    from torchtriage.knowledge.rules import default_rules

    waiting = [r for r in default_rules() if r.printer_waits]
    assert len(waiting) >= 8
    for rule in waiting:
        for example in rule.examples:
            code, verdict = triage_json(write(tmp_path, "rank3.log", [f"[rank3]: {example}"]))
            assert 3 not in verdict["culprit_ranks"], (rule.id, example)
    barrier = (
        "torch.distributed.DistStoreError: Timed out waiting on barrier on rank 0, for key prefix: torchelastic/agent/"
        "terminal_state (world_size=4, missing_ranks=[rank 2 (node-2), rank 3 (node-3)], timeout=300)"
    )
    code, verdict = triage_json(write(tmp_path, "agent.log", [barrier]))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("rendezvous", [2, 3])


def _remote_error(rank: int) -> str:
    return (
        f"[rank{rank}]:[E1203 10:00:00.000000000 ProcessGroupNCCL.cpp:1895] [PG ID 0 PG GUID 0(default_pg) Rank "
        f"{rank}] Process group watchdog thread terminated with exception: NCCL error: remote process exited or there "
        "was a network error, NCCL version 2.21.5"
    )


def test_ranks_that_lost_a_peer_are_not_named_the_rank_that_left_is(tmp_path):
    # ncclRemoteError (printer_lost_peer): each reporting rank lost a peer. Rank 6 printed nothing: it left first.
    lines = [_remote_error(r) for r in (0, 1, 2, 3, 4, 5, 7)]
    code, verdict = triage_json(write(tmp_path, "job.log", lines))
    assert (verdict["category"], verdict["culprit_ranks"], verdict["confidence"]) == ("nccl_transport", [6], "medium")
    # One rank's lines alone name nobody: an excerpt, or its own link.
    code, verdict = triage_json(write(tmp_path, "rank4.log", [_remote_error(4)]))
    assert verdict["culprit_ranks"] == []
    # A peer that ran out of memory left first: its failure is the verdict, the lost connections its aftermath.
    oom = "[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 2 has a total capacity"
    code, verdict = triage_json(write(tmp_path, "oom.log", [_remote_error(r) for r in (0, 1, 3)] + [oom]))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", [2])


def test_a_loss_that_went_nan_on_every_rank_names_none_and_on_one_rank_names_it(tmp_path):
    # The gradient all-reduce spreads one replica's NaN to every rank's weights: a NaN every rank reports began on
    # one of them, which the logs do not say (nan_inf.every_rank); a NaN only one rank reports is that rank's.
    healthy = [f"[rank{r}]: step {s} loss 2.3{r} grad_norm 1.2" for s in (98, 99) for r in range(4)]
    every = healthy + [f"[rank{r}]: step 100 loss nan grad_norm nan" for r in range(4)]
    code, verdict = triage_json(write(tmp_path, "every.log", every))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("nan_inf", [])
    assert any(f["kind"] == "nan_inf.every_rank" for f in verdict["findings"])
    one = healthy + ["[rank2]: step 100 loss nan grad_norm nan"] + [f"[rank{r}]: step 100 loss 2.2" for r in (0, 1, 3)]
    code, verdict = triage_json(write(tmp_path, "one.log", one))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("nan_inf", [2])


def test_a_set_up_failure_every_rank_meets_alike_names_no_rank_and_one_rank_alone_is_named(tmp_path):
    # bootstrap.cc / ibvwrap.cc: each rank of a host runs the same set-up with the same interfaces and HCAs, so a
    # failure every rank the logs show prints is their host's set-up (or the link's), not one rank's.
    def no_interface(rank):
        return [
            f"[rank{rank}]:node7:{1900 + rank}:{1900 + rank} [{rank}] bootstrap.cc:45 NCCL WARN Bootstrap : "
            "no socket interface found",
            f"[rank{rank}]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, internal "
            "error - please report this issue to the NCCL developers, NCCL version 2.21.5",
        ]

    every = [line for rank in range(4) for line in no_interface(rank)]
    code, verdict = triage_json(write(tmp_path, "every.log", every))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("nccl_transport", [])
    assert "met it alike" in verdict["summary"]
    assert not verdict["facts"].get("candidates")  # no rank is a candidate: the set-up is the place
    # The same line from one rank among healthy peers is that rank's (its host's interfaces differ).
    healthy = [f"[rank{rank}]: step 1 loss 2.3" for rank in (0, 1, 3)]
    code, verdict = triage_json(write(tmp_path, "one.log", healthy + no_interface(2)))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("nccl_transport", [2])
    qp = (
        "[rank{r}]:spark2:{pid}:{pid} [{r}] misc/ibvwrap.cc:309 NCCL WARN Call to ibv_modify_qp failed with 22 "
        "Invalid argument, on dev mlx5_0:1, curr state INIT, next state RTR, local GID index 3"
    )
    lines = [qp.format(r=r, pid=3100 + r) for r in range(4, 8)]
    code, verdict = triage_json(write(tmp_path, "qp.log", lines))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("nccl_transport", [])


def _watchdog_timeout(rank: int, seq: int) -> str:
    return (
        f"[rank{rank}]:[E1203 10:00:0{rank}.000000000 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught "
        f"collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, "
        "Timeout(ms)=600000) ran for 600005 milliseconds before timing out."
    )


def test_the_desync_report_blames_the_ranks_that_did_not_join_not_those_inside_the_collective(tmp_path):
    # TraceUtils.h, analyzeLaggingRanks: at the earliest collective, the ranks that "joined but didn't finish" wait
    # inside it; the one that "finished #47, but didn't join #48" is the one they wait for.
    report = [
        "\t - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:",
        "\t   - [0, 1, 3] joined but didn't finish collective #48 (count from 1)",
        "\t     [2] finished collective #47, but didn't join collective #48 (count from 1)",
    ]
    lines = [_watchdog_timeout(r, 48) for r in (0, 1, 3)] + report
    code, verdict = triage_json(write(tmp_path, "desync.log", lines))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("nccl_timeout", [2])
    # Every rank inside it: none lagged, and no rank is blamed for the collective that never completed.
    lines = [_watchdog_timeout(r, 39) for r in range(4)] + [report[0], report[1].replace("0, 1, 3", "0, 1, 2, 3")]
    code, verdict = triage_json(write(tmp_path, "desync_all.log", lines))
    assert verdict["category"] == "nccl_timeout" and verdict["culprit_ranks"] == []


def test_an_exception_no_rule_knows_takes_the_category_of_its_type_with_medium_confidence(tmp_path):
    lines = [
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/job/train.py", line 90, in <module>',
        "[rank1]:     state = checkpoint['model.layers.0.weight']",
        "[rank1]: KeyError: 'model.layers.0.weight'",
    ]
    code, verdict = triage_json(write(tmp_path, "job.log", lines))
    assert (verdict["category"], verdict["culprit_ranks"], verdict["confidence"]) == ("usage", [1], "medium")
    code, verdict = triage_json(write(tmp_path, "oom.log", ["[rank2]: torch.cuda.OutOfMemoryError"]))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", [2])
    code, verdict = triage_json(write(tmp_path, "killed.log", ["step 3 loss 1.2", "Killed"]))
    assert verdict["category"] == "host_oom"


# ProcessGroupNCCL's lines, from its format strings: the watchdog's status line names the group whose collective
# timed out; the heartbeat monitor's dump line gives the counters of the group it belongs to (the default one).
STATUS = (
    "[rank{rank}]:[E0601 12:10:01.2 ProcessGroupNCCL.cpp:1785] [PG ID {pg} PG GUID {guid} Rank {group_rank}] "
    "Exception (either an error or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: "
    "{enqueued}, last completed NCCL work: {completed}."
)
DUMP = (
    "[rank{rank}]:[E0601 12:10:02.7 ProcessGroupNCCL.cpp:1914] [PG ID 0 PG GUID 0(default_pg) Rank {rank}] Received "
    "a dump signal due to a collective timeout from this local rank and we will try our best to dump the debug info. "
    "Last enqueued NCCL work: {enqueued}, last completed NCCL work: {enqueued}."
)


def test_counters_of_two_process_groups_are_never_compared(tmp_path):
    # Ranks 4, 5, 7 of the TP group (4-7) time out at its seq 880; every rank's dump line gives the default group's
    # counters (120). Rank 6 never reached the TP op: the three that waited are not "departed from seq 120".
    tp = "2(TENSOR_MODEL_PARALLEL_GROUP)"
    lines = [
        STATUS.format(rank=r, pg=2, guid=tp, group_rank=r - 4, seq=880, enqueued=880, completed=879) for r in (4, 5, 7)
    ]
    lines += [DUMP.format(rank=r, enqueued=120) for r in range(8)]
    code, verdict = triage_json(write(tmp_path, "job.log", lines))
    assert verdict["category"] == "nccl_timeout"
    assert not set(verdict["culprit_ranks"]) & {4, 5, 7}, verdict["summary"]


def test_a_rank_that_queued_ops_behind_the_one_every_rank_timed_out_in_is_not_blamed(tmp_path):
    # Enqueueing is asynchronous: rank 2 queued seq 313 behind 312, and its own watchdog timed out at 312 as every
    # rank's did. Every rank issued 312: the counters name no rank.
    lines = [
        STATUS.format(
            rank=r, pg=0, guid="0(default_pg)", group_rank=r, seq=312, enqueued=313 if r == 2 else 312, completed=311
        )
        for r in range(4)
    ]
    code, verdict = triage_json(write(tmp_path, "job.log", lines))
    assert verdict["culprit_ranks"] == [] and verdict["confidence"] != "high", verdict["summary"]
    # A rank that never enqueued 312 (its dump line: everything it enqueued completed) is still the one named.
    lines[1] = DUMP.format(rank=1, enqueued=311)
    code, verdict = triage_json(write(tmp_path, "job.log", lines))
    assert verdict["culprit_ranks"] == [1], verdict["summary"]


def test_ranks_that_queued_less_behind_the_collective_every_rank_timed_out_in_are_not_behind(tmp_path):
    # Ranks 0-1 enqueued seq 312 and stopped; ranks 2-4 queued 313 behind it; every one's watchdog timed out at 312
    # (rank 4 says it in its timeout line, its status has no seq). Fewer ops queued behind the one they all wait in
    # is no departure: the rank that never joined printed nothing (rank 5 of the 8 NCCL set up), and the candidates are
    # the silent ones, never the ranks that waited.
    lines = [
        STATUS.format(
            rank=r, pg=0, guid="0(default_pg)", group_rank=r, seq=312, enqueued=312 if r < 2 else 313, completed=311
        )
        for r in range(4)
    ]
    lines += [
        DUMP.format(rank=4, enqueued=313).replace("last completed NCCL work: 313", "last completed NCCL work: 311")
    ]
    timeout = "[rank{rank}]:[E0601 12:10:01.0 ProcessGroupNCCL.cpp:689] " + WATCHDOG.replace("812", "312")
    lines += [timeout.format(rank=r) for r in range(5)]
    init = "[rank0]:gpu-a:4121:4190 [0] NCCL INFO comm 0x55d1c2a0b3f0 rank 0 nranks 8 cudaDev 0 busId 18000 - Init "
    code, verdict = triage_json(write(tmp_path, "job.log", [init + "COMPLETE", *lines]))
    assert verdict["culprit_ranks"] == [], verdict["summary"]
    assert verdict["facts"].get("candidates") == [5, 6, 7], verdict["summary"]


def test_the_ranks_monitored_barrier_names_are_the_culprits_whatever_the_others_stacks_say(tmp_path):
    # ProcessGroupGloo::monitoredBarrier: rank 0 names each rank it missed (one line per rank with
    # wait_all_ranks=True); the ranks that arrived raise "successfully reached monitoredBarrier". A traceback cut
    # above torch's own frames must not make those ranks "in no collective".
    missed = "[rank0]:[E0405 10:01:02.0{r} ProcessGroupGloo.cpp:2928] [Rank 0]: Rank {r} failed to pass"
    lines = [missed.format(r=r) + " monitoredBarrier in 60000 ms" for r in (2, 5)]
    for rank in (1, 3):
        lines += [
            f"[rank{rank}]: Traceback (most recent call last):",
            f'[rank{rank}]:   File "/workspace/train.py", line 431, in main',
            f"[rank{rank}]:     dist.monitored_barrier(group=gloo_group, timeout=timedelta(seconds=60))",
            f"[rank{rank}]: RuntimeError: Rank {rank} successfully reached monitoredBarrier, but received errors while "
            "waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.",
        ]
    code, verdict = triage_json(write(tmp_path, "job.log", lines))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("hang", [2, 5]), verdict["summary"]


def test_loss_scale_calibration_before_another_failure_is_not_its_cause(tmp_path):
    # deepspeed/runtime/fp16/loss_scaler.py: overflows at the start are the scaler calibrating (every rank agrees on
    # them); the collective that times out an hour later is the failure.
    overflow = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768"
    lines = [
        f"[rank0]:[2024-11-17 08:00:0{i},000] [INFO] [loss_scaler.py:190:update_scale] {overflow}" for i in range(3)
    ]
    alone = triage_json(write(tmp_path, "alone.log", lines))[1]
    assert alone["category"] == "nan_inf"
    lines += [f"[rank{r}]:[E1117 09:10:01.0 ProcessGroupNCCL.cpp:689] {WATCHDOG.format(rank=r)}" for r in (0, 1, 2)]
    assert triage_json(write(tmp_path, "then.log", lines))[1]["category"] == "nccl_timeout"


def test_a_rank_field_of_the_jobs_own_logging_format_names_the_rank(tmp_path):
    # `%(asctime)s - rank %(rank)s - %(levelname)s - %(message)s`, a format many training scripts set up.
    lines = [
        "2025-11-06 10:12:00,114 - rank 0 - INFO - step 2200 loss 1.9821",
        f"2025-11-06 10:14:02,551 - rank 2 - ERROR - {OOM}",
        "2025-11-06 10:24:03,002 - rank 0 - ERROR - collective timed out",
    ]
    code, verdict = triage_json(write(tmp_path, "job.log", lines))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", [2])


LOOPBACK = (
    "[W ProcessGroupGloo.cpp:721] Warning: Unable to resolve hostname to a (local) address. Using the loopback "
    "address as fallback. Manually set the network interface to bind to with GLOO_SOCKET_IFNAME. (function operator())"
)
FULL_MESH = (
    "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error"
)


def test_the_rank_that_advertised_its_loopback_address_is_the_one_its_peers_could_not_connect_to(tmp_path):
    # ProcessGroupGloo.cpp createDefaultDevice: a rank whose host name resolves to nothing usable listens on
    # loopback and advertises it; its peers on other hosts cannot connect, and they report connectFullMesh.
    lines = [f"[rank9]:{LOOPBACK}", f"[rank8]:{LOOPBACK}", f"[rank0]:{FULL_MESH}", f"[rank1]:{FULL_MESH}"]
    code, verdict = triage_json(write(tmp_path, "mesh.log", lines))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("rendezvous", [8, 9])
    assert verdict["confidence"] != "high"  # read from a warning, not from the failure itself
    # Without the warning, every rank seen fails alike: no rank is named (logs.every_rank_alike).
    code, verdict = triage_json(write(tmp_path, "alike.log", lines[2:]))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("rendezvous", [])
    # On its own (one host, where loopback works) the warning changes nothing.
    steps = ["[rank0]: step 1 loss 2.0", "[rank0]: step 2 loss 1.9"]
    code, alone = triage_json(write(tmp_path, "warned.log", [f"[rank0]:{LOOPBACK}", *steps]))
    code, plain = triage_json(write(tmp_path, "plain.log", steps))
    assert (alone["category"], alone["confidence"]) == (plain["category"], plain["confidence"])


def test_ranks_that_wait_for_the_default_groups_nccl_id_name_rank_0_and_a_subgroups_names_nobody(tmp_path):
    # ProcessGroupNCCL.cpp broadcastUniqueNCCLID: the group's rank 0 publishes the id under its store prefix, and
    # TCPStore's "wait timeout after %dms, keys: %s" gives the whole key: "default_pg/0/" is the default group's.
    def waiting(rank, group="0"):
        return (
            f"[rank{rank}]: torch.distributed.DistBackendError: [{rank}] is setting up NCCL communicator and "
            f"retrieving ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: "
            f"wait timeout after 600000ms, keys: /default_pg/{group}//cuda//0"
        )

    verdict = triage_json(write(tmp_path, "job.log", [waiting(r) for r in (1, 2, 3)]))[1]
    assert (verdict["category"], verdict["culprit_ranks"]) == ("rendezvous", [0]), verdict["summary"]
    verdict = triage_json(write(tmp_path, "job.log", [waiting(r, group="2") for r in (1, 2, 3)]))[1]
    assert (verdict["category"], verdict["culprit_ranks"]) == ("rendezvous", []), verdict["summary"]
