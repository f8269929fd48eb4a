"""An Xid names a GPU by its PCI address; NCCL's Init COMPLETE lines give each rank's GPU by the same address
(src/misc/utils.cc int64ToBusId: domain << 20 | bus << 12 | device << 4 | function). Together they say which
rank's GPU failed, or that the failed GPU was none of the job's. Logs written from the driver's and NCCL's
format strings."""

from conftest import triage_json

BUSES = ["18000", "2a000", "3a000", "5d000", "9a000", "ab000", "ba000", "db000"]


def init(rank, world=8, host="gpu-node-17", bus=None):
    # NCCL src/init.cc: "comm %p rank %d nranks %d cudaDev %d nvmlDev %d busId %lx commId 0x%llx - Init COMPLETE"
    bus = bus or BUSES[rank % 8]
    return (
        f"{host}:{50120 + rank}:{50260 + rank} [{rank % 8}] NCCL INFO comm 0x55d0c0b1302{rank % 8} rank {rank} "
        f"nranks {world} cudaDev {rank % 8} nvmlDev {rank % 8} busId {bus} commId 0x9e1c7d2a40f1b358 - Init COMPLETE"
    )


def xid(bus, host=None):
    # NVIDIA's kernel module: "NVRM: Xid (PCI:%04x:%02x:%02x): %d, ..."; syslog puts "<host> kernel: " before it
    where = f"Nov  6 10:14:01 {host} kernel: " if host else "[Thu Nov  6 10:14:01 2025] "
    return f"{where}NVRM: Xid (PCI:0000:{bus}:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


TIMEOUTS = [
    f"[rank{r}]:[E1106 10:24:03.902117365 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=902, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 "
    "milliseconds before timing out."
    for r in (0, 1, 2, 3, 4, 6, 7)
]
ROOT_CAUSE = [  # torchrun's report names the first process it saw fail: a victim here
    "Root Cause (first observed failure):",
    "[0]:",
    "  time      : 2025-11-06_10:24:04",
    "  host      : gpu-node-17",
    "  rank      : 0 (local_rank: 0)",
    "  exitcode  : -6 (pid: 50120)",
]
OOM = (
    "[rank1]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 1 has a total capacity of "
    "79.10 GiB of which 1.91 GiB is free."
)


def verdict_of(tmp_path, lines):
    path = tmp_path / "job.log"
    path.write_text("\n".join(lines) + "\n")
    return triage_json(path)[1]


def test_an_xid_on_one_ranks_gpu_names_that_rank_not_the_launchers_first_failure(tmp_path):
    verdict = verdict_of(tmp_path, [*(init(r) for r in range(8)), *TIMEOUTS, *ROOT_CAUSE, xid("ab")])
    assert (verdict["category"], verdict["culprit_ranks"]) == ("gpu_fault", [5]), verdict["summary"]


def test_an_xid_on_a_gpu_none_of_the_jobs_ranks_used_says_nothing_of_the_job(tmp_path):
    # Four ranks on GPUs 18000-5d000 of a node with eight: the Xid on ba000 is another tenant's.
    lines = [*(init(r, world=4) for r in range(4)), OOM, xid("ba")]
    verdict = verdict_of(tmp_path, lines)
    assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", [1]), verdict["summary"]
    # Without every rank's GPU known, the Xid may be the job's: it is not set aside.
    assert verdict_of(tmp_path, [*lines[1:4], OOM, xid("ba")])["category"] == "gpu_fault"


def test_across_nodes_the_kernel_lines_host_decides_and_without_it_nothing_is_placed(tmp_path):
    nodes = [init(r, world=16, host="gpu-a" if r < 8 else "gpu-b") for r in range(16)]
    assert verdict_of(tmp_path, [*nodes, xid("ab", host="gpu-b")])["culprit_ranks"] == [13]
    assert verdict_of(tmp_path, [*nodes, xid("ab")])["culprit_ranks"] == []


def test_an_xid_of_an_earlier_boot_is_history_not_the_cause(tmp_path):
    # journalctl -k over two boots prints "-- Boot <boot id> --" between them ("-- Reboot --" before systemd 250):
    # the driver has been reloaded since the Xid above it, so the job that ran after it failed of its own error.
    oom = (
        "[rank6]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 6 has a total capacity "
        "of 79.10 GiB of which 1.91 GiB is free."
    )
    loaded = "Nov 02 09:40:18 gpu-node-17 kernel: NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.127.05"
    for separator in ("-- Boot 7f3a9c0e1d2b4e5f8a6b1c2d3e4f5a6b --", "-- Reboot --"):
        path = tmp_path / "job.log"
        path.write_text("\n".join([xid("ba", "gpu-node-17"), separator, loaded, *map(init, range(8)), oom]) + "\n")
        _, verdict = triage_json(path)
        assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", [6]), (separator, verdict["summary"])
        roles = {f["kind"]: f["role"] for f in verdict["findings"]}
        assert roles["gpu_fault.fallen_off_bus"] == "collateral"
    # The same Xid in the boot the job ran in is the cause.
    path.write_text("\n".join([loaded, *map(init, range(8)), xid("ba", "gpu-node-17"), oom]) + "\n")
    assert triage_json(path)[1]["category"] == "gpu_fault"


def xid31(bus, pid):
    # Xid 31 (an MMU fault) names the process whose GPU context faulted
    return (
        f"[Thu Nov  6 10:13:40 2025] NVRM: Xid (PCI:0000:{bus}:00): 31, pid={pid}, name=python3, Ch 00000018, "
        "intr 00000000. MMU Fault: ENGINE GRAPHICS GPC3 GPCCLIENT_T1_0 faulted @ 0x7fa2_00000000."
    )


def test_an_xid_whose_node_is_not_said_is_placed_by_its_pid(tmp_path):
    nodes = [init(r, world=16, host="gpu-a" if r < 8 else "gpu-b") for r in range(16)]
    assert verdict_of(tmp_path, [*nodes, xid31("ab", 50120 + 13)])["culprit_ranks"] == [13]
    assert verdict_of(tmp_path, [*nodes, xid31("ab", 4242)])["culprit_ranks"] == []


def test_the_kernels_lines_appended_after_the_jobs_are_not_its_aftermath_by_their_place(tmp_path):
    # dmesg appended after the job's log: the Xid at 10:13 came ten minutes before the watchdogs fired; its place
    # below their lines says nothing of the order.
    lines = [*map(init, range(8)), *TIMEOUTS, xid31("9a", 50124)]
    verdict = verdict_of(tmp_path, lines)
    assert (verdict["category"], verdict["culprit_ranks"]) == ("gpu_fault", [4]), verdict["summary"]


def test_an_xid_whose_node_is_not_said_is_the_one_of_the_ranks_on_its_bus_whose_gpu_failed_under_it(tmp_path):
    # Bus ab000 is rank 5's GPU on gpu-a and rank 13's on gpu-b; only rank 13's own lines report a CUDA error (a GPU
    # that fell off the bus fails the kernels of the process using it), so the Xid is rank 13's. The culprit's
    # machine is read from NCCL's prefix on its set-up line.
    nodes = [init(r, world=16, host="gpu-a" if r < 8 else "gpu-b") for r in range(16)]
    launch = "[rank13]:RuntimeError: CUDA error: unspecified launch failure"
    remote = "[rank5]:ncclRemoteError: A call failed possibly due to a network error or a remote process exiting."
    verdict = verdict_of(tmp_path, [*nodes, remote, launch, "== gpu-b dmesg ==", xid("ab")])
    assert (verdict["category"], verdict["culprit_ranks"]) == ("gpu_fault", [13]), verdict["summary"]
    (machine,) = verdict["culprit_machines"]
    assert (machine["host"], machine["pid"], machine["sources"]) == ("gpu-b", 50120 + 13, ["nccl"])
    # Both ranks on that bus failed on their own: the Xid is placed on neither, each names its own failure.
    both = "[rank5]:RuntimeError: CUDA error: unspecified launch failure"
    assert verdict_of(tmp_path, [*nodes, both, launch, xid("ab")])["culprit_ranks"] == [5, 13]


def test_an_xid_with_no_set_up_lines_is_placed_by_the_pid_torchruns_report_gives_a_rank(tmp_path):
    # No NCCL line says where a rank ran; torchrun's report does ("rank : 4", "exitcode : -6 (pid: 50124)"), and the
    # driver names the process whose context faulted: the Xid is rank 4's, not the victims' timeouts.
    report = [
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2025-11-06_10:24:11",
        "  host      : gpu-node-17",
        "  rank      : 4 (local_rank: 4)",
        "  exitcode  : -6 (pid: 50124)",
    ]
    timeouts = [line for line in TIMEOUTS if not line.startswith("[rank4]")]
    verdict = verdict_of(tmp_path, [*timeouts, *report, xid31("9a", 50124)])
    assert (verdict["category"], verdict["culprit_ranks"]) == ("gpu_fault", [4]), verdict["summary"]
    # Another process's pid places nothing: the Xid names no rank, and the victims are not named for it.
    assert verdict_of(tmp_path, [*timeouts, *report, xid31("9a", 4242)])["culprit_ranks"] == []


def test_the_drivers_three_line_fallen_off_the_bus_leads_the_nccl_errors_after_it(tmp_path):
    # kernel-open/nvidia/nv.c, where the GPU's registers read all ones: one printf of three lines, which the kernel
    # log gives as three records, none saying "GPU has fallen off the bus"; NCCL then meets the lost device.
    log = tmp_path / "job.log"
    log.write_text(
        "\n".join(
            [init(r) for r in range(8)]
            + [
                "[ 1843.308145] NVRM: The NVIDIA GPU 0000:5d:00.0",
                "[ 1843.308150] NVRM: (PCI ID: 10de:2330) installed in this system has",
                "[ 1843.308151] NVRM: fallen off the bus and is not responding to commands.",
                "gpu-node-17:50123:50301 [3] NCCL WARN Cuda failure 'unknown error'",
                "[rank3]: RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error",
            ]
        )
        + "\n"
    )
    code, verdict = triage_json(log)
    assert (verdict["category"], verdict["confidence"]) == ("gpu_fault", "high"), verdict["summary"]
