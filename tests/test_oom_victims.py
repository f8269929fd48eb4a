"""Whose process the Linux OOM killer killed: the kernel names its victim by pid and name (mm/oom_kill.c), NCCL's
set-up lines give each rank's pid (host:pid:tid). Logs written from the kernel's and NCCL's format strings."""

from conftest import triage_json


def init(rank, world=8, host="gpu-node-17"):
    # NCCL src/init.cc: "comm %p rank %d nranks %d cudaDev %d nvmlDev %d busId %lx commId 0x%llx - Init COMPLETE"
    return (
        f"{host}:{50120 + rank}:{50260 + rank} [{rank}] NCCL INFO comm 0x55d0c0b1302{rank} rank {rank} nranks {world} "
        f"cudaDev {rank} nvmlDev {rank} busId {rank + 1}a000 commId 0x9e1c7d2a40f1b358 - Init COMPLETE"
    )


def kill(pid, task, memcg="/slurm/uid_1000/job_4411/step_0"):
    # mm/oom_kill.c: dump_oom_summary's constraint line, then __oom_kill_process's "Killed process %d (%s) ..."
    return [
        f"[5099001.002211] {task} invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
        f"[5099001.002390] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0-1,"
        f"oom_memcg={memcg},task_memcg={memcg},task={task},pid={pid},uid=1000",
        f"[5099001.002411] Memory cgroup out of memory: Killed process {pid} ({task}) total-vm:2204412kB, "
        "anon-rss:262144kB, file-rss:10240kB, shmem-rss:0kB, UID:1000 pgtables:1204kB oom_score_adj:0",
    ]


STEPS = [f"[rank0]:step {i} | loss {2.4 - i / 1000:.4f}" for i in range(100, 130)]
CUDA_OOM = (
    "[rank6]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 6 has a total capacity of "
    "79.10 GiB of which 1.91 GiB is free."
)


def write(tmp_path, lines):
    path = tmp_path / "job.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_another_programs_kill_says_nothing_of_the_job(tmp_path):
    # A monitoring agent at its own service cgroup's limit: the job's rank 6 died of its own CUDA OOM.
    foreign = kill(2231, "node_exporter", "/system.slice/node_exporter.service")
    for inits in ([], [init(r) for r in range(8)]):
        _, verdict = triage_json(write(tmp_path, [*inits, *STEPS, *foreign, CUDA_OOM]))
        assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", [6]), verdict["summary"]
        roles = {f["role"] for f in verdict["findings"] if f["kind"] == "host_oom.kernel_oom_killer"}
        assert roles == {"collateral"}


def test_a_kill_of_a_ranks_pid_names_that_rank(tmp_path):
    _, verdict = triage_json(write(tmp_path, [*(init(r) for r in range(8)), *STEPS, *kill(50123, "python3")]))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("host_oom", [3]), verdict["summary"]


def test_a_python_process_that_is_no_ranks_is_still_the_jobs(tmp_path):
    # A DataLoader worker: its own pid, Python's name. The kill is the job's; which rank owned it is not said.
    for name in ("python3", "pt_main_thread"):
        _, verdict = triage_json(write(tmp_path, [*(init(r) for r in range(8)), *STEPS, *kill(61234, name)]))
        assert (verdict["category"], verdict["culprit_ranks"]) == ("host_oom", []), (name, verdict["summary"])
