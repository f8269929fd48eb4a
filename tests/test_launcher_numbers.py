"""A launcher's numbers are ranks only where the launcher started the ranks: srun's "task N" and mpirun's "process
rank N" number torchrun's agents (one per node) where the file shows them, and a file named after a Kubeflow pod
or a DeepSpeed host ("worker-1") is a node's. Logs written from the programs' format strings."""

from conftest import triage_json

# torch/distributed/run.py: the banner torchrun's agent prints when it sets OMP_NUM_THREADS for its workers
BANNER = [
    "W0304 08:00:00.000000 2211 torch/distributed/run.py:793] *****************************************",
    "W0304 08:00:00.000000 2211 torch/distributed/run.py:793] Setting OMP_NUM_THREADS environment variable for each "
    "process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal "
    "performance in your application as needed. ",
]
STEPS = [f"[rank0]:step {i} | loss {3.0 - i / 100:.2f}" for i in range(1, 9)]
# Slurm src/srun: "srun: error: %s: task %s: Out Of Memory"; Open MPI help-errmgr-base.txt proc-aborted-strsignal
SRUN_OOM = "srun: error: gpu-node-02: task 1: Out Of Memory"
MPI_KILLED = "mpirun noticed that process rank 1 with PID 4242 on node gpu-b07 exited on signal 9 (Killed)."
# a rank's own traceback through torch.distributed.elastic's @record decorator: no agent's line
RECORDED = [
    "[rank3]: Traceback (most recent call last):",
    '[rank3]:   File "/opt/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/'
    '__init__.py", line 357, in wrapper',
    "[rank3]:     return f(*args, **kwargs)",
    "[rank3]: ValueError: bad sample",
]


def write(tmp_path, lines, name="job.log"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_task_of_srun_that_ran_torchrun_is_a_node_not_a_rank(tmp_path):
    _, verdict = triage_json(write(tmp_path, [*BANNER, *STEPS, SRUN_OOM]))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("host_oom", []), verdict["summary"]
    assert "gpu-node-02" in verdict["summary"] and "task 1" in verdict["summary"]


def test_a_task_of_srun_that_ran_the_ranks_is_a_rank_said_at_medium(tmp_path):
    # Nothing shows torchrun's agent, so srun started the ranks and task 1 is rank 1; but an agent's lines need not
    # be in a log (its banner goes to another file, or is cut off), and then task 1 is a node: not said at high.
    verdicts = [triage_json(write(tmp_path, lines))[1] for lines in ([*STEPS, SRUN_OOM], [*STEPS, *RECORDED, SRUN_OOM])]
    for verdict in verdicts:
        assert (verdict["category"], verdict["culprit_ranks"]) == ("host_oom", [1]), verdict["summary"]
        assert verdict["confidence"] == "medium"
    assert any("task 1" in doubt for doubt in verdicts[0]["facts"]["doubts"])  # the second's: rank 3's own error


def test_mpiruns_process_rank_follows_what_it_started(tmp_path):
    assert triage_json(write(tmp_path, [*BANNER, *STEPS, MPI_KILLED]))[1]["culprit_ranks"] == []
    assert triage_json(write(tmp_path, [*STEPS, MPI_KILLED]))[1]["culprit_ranks"] == [1]


def test_a_file_named_after_a_worker_pod_or_host_names_no_rank(tmp_path):
    # Kubeflow PyTorchJob pods are <job>-worker-<n>; `kubectl describe pod` of one (container status reason)
    pod = ["Name:             llm-pretrain-worker-1", "    Last State:     Terminated", "      Reason:       OOMKilled"]
    assert triage_json(write(tmp_path, pod, "llm-pretrain-worker-1.log"))[1]["culprit_ranks"] == []
    assert triage_json(write(tmp_path, pod, "rank1.log"))[1]["culprit_ranks"] == [1]


def agent_account(group_rank, nodes=2, per_node=4):
    # torch/distributed/elastic/agent/server/api.py _rendezvous: "[%(role)s] Rendezvous complete for workers. Result:"
    first = group_rank * per_node
    return [
        "INFO:torch.distributed.elastic.agent.server.api:[default] Rendezvous complete for workers. Result:",
        "  restart_count=0",
        "  master_addr=gpu-a",
        "  master_port=29500",
        f"  group_rank={group_rank}",
        f"  group_world_size={nodes}",
        f"  local_ranks={list(range(per_node))}",
        f"  role_ranks={list(range(first, first + per_node))}",
        f"  global_ranks={list(range(first, first + per_node))}",
        f"  role_world_sizes={[nodes * per_node] * per_node}",
        f"  global_world_sizes={[nodes * per_node] * per_node}",
    ]


# torchrun --tee 3 on torch 2.0/2.1 prefixes each worker's line with its role and LOCAL rank (tail_log.py)
TEE_OOM = (
    "[default2]:torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 2; 79.15 GiB total "
    "capacity; 75.12 GiB already allocated; 1.02 GiB free; 76.80 GiB reserved in total by PyTorch)"
)


def test_a_roles_prefix_is_a_local_rank_placed_by_the_agents_account(tmp_path):
    # node 1 of 2: local 2 is the job's rank 6
    assert triage_json(write(tmp_path, [*agent_account(1), TEE_OOM]))[1]["culprit_ranks"] == [6]
    # or by the agent's failure report: "rank : 6 (local_rank: 2)"
    report = [
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2024-02-01_10:00:00",
        "  host      : gpu-b",
        "  rank      : 6 (local_rank: 2)",
        "  exitcode  : 1 (pid: 5512)",
    ]
    assert triage_json(write(tmp_path, ["  group_world_size=2", TEE_OOM, *report]))[1]["culprit_ranks"] == [6]


def test_a_local_rank_no_account_places_names_no_rank_on_several_nodes_and_itself_on_one(tmp_path):
    both_nodes = [*agent_account(0), *agent_account(1), TEE_OOM]  # two agents' output in one file: whose line?
    assert triage_json(write(tmp_path, both_nodes))[1]["culprit_ranks"] == []
    assert triage_json(write(tmp_path, ["  group_world_size=2", TEE_OOM]))[1]["culprit_ranks"] == []
    # On one node, said by its agent, local rank 2 is the job's; with nothing said of the nodes no rank is named and
    # the local one is said: node 3's local rank 2 prints the same prefix.
    _, one_node = triage_json(write(tmp_path, ["  group_world_size=1", TEE_OOM]))
    assert (one_node["culprit_ranks"], one_node["confidence"]) == ([2], "high")
    _, unsaid = triage_json(write(tmp_path, [TEE_OOM]))
    assert (unsaid["category"], unsaid["culprit_ranks"], unsaid["confidence"]) == ("oom", [], "high")
    assert unsaid["facts"]["local_ranks"] == [2] and "local rank 2 of a node" in unsaid["summary"]


def test_a_local_rank_that_only_a_lesser_line_names_is_still_a_local_rank(tmp_path):
    # The driver's Xid names no rank (the kernel's line); the CUDA error under "[default4]:" is what names one, a
    # rank within its node: the verdict says the local rank, whichever line leads.
    xid = (
        "[3589791.241081] NVRM: Xid (PCI:0000:18:00): 119, pid=1941502, name=pt_main_thread, Timeout after 6s of "
        "waiting for RPC response from GPU10 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20803039 0x8)."
    )
    error = "[default4]:RuntimeError: CUDA error: unknown error"
    _, verdict = triage_json(write(tmp_path, [error, xid]))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("gpu_fault", []), verdict["summary"]
    assert verdict["facts"]["local_ranks"] == [4] and "local rank 4 of a node" in verdict["summary"]


def test_a_traceback_under_a_local_prefix_names_a_local_rank_as_the_lines_beside_it_do(tmp_path):
    # XLA's RESOURCE_EXHAUSTED under "[default2]:" and the RuntimeError's traceback it raised: the traceback's rank is
    # the prefix's, a rank within its node, as the line's is (core generator seed 2825: "rank 2" at high, truth 10).
    oom = [
        "[default2]:2025-08-04 17:54:50.789273: E tensorflow/compiler/xla/xla_client/xla_util.cc:90]   (0) "
        "RESOURCE_EXHAUSTED: Attempting to reserve 5.08G at the bottom of memory. That was not possible.",
        "[default2]:Traceback (most recent call last):",
        '[default2]:  File "/workspace/train.py", line 481, in <module>',
        "[default2]:    trainer.fit(model, datamodule=dm)",
        "[default2]:RuntimeError: Resource exhausted: From /job:localservice/replica:0/task:0:",
    ]
    _, verdict = triage_json(write(tmp_path, oom))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", []), verdict["summary"]
    assert verdict["facts"]["local_ranks"] == [2] and "local rank 2 of a node" in verdict["summary"]
    assert verdict["facts"]["user_frame"]["line"] == 481 and verdict["facts"]["user_frame"]["rank_is_local"]
    _, placed = triage_json(write(tmp_path, [*agent_account(1, per_node=8), *oom]))
    assert (placed["category"], placed["culprit_ranks"]) == ("oom", [10]), placed["summary"]


def test_values_read_where_the_log_stops_under_a_local_prefix_are_said_on_the_local_rank(tmp_path):
    # A log of "step value" lines that go NaN where it stops, under "[default5]:" (values no message names, read from
    # the log's tail): their rank is local rank 5 of some node; under node 1's agent account it is rank 13.
    values = [f"[default5]:{step} {value}" for step, value in ((89675, "2.4926"), (89676, "nan"), (89677, "nan nan"))]
    _, verdict = triage_json(write(tmp_path, values))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("nan_inf", []), verdict["summary"]
    assert verdict["facts"]["local_ranks"] == [5], verdict["summary"]
    _, placed = triage_json(write(tmp_path, [*agent_account(1, per_node=8), *values]))
    assert (placed["category"], placed["culprit_ranks"]) == ("nan_inf", [13]), placed["summary"]


def test_nccls_world_communicator_under_a_local_prefix_places_the_rank(tmp_path):
    # NCCL 2.19+ src/init.cc "comm %p rank %d nranks %d cudaDev %d nvmlDev %d busId %lx commId 0x%llx - Init START":
    # local rank 2's process is rank 10 of the 16-rank world (a subgroup's smaller communicator says nothing of it).
    def comm(local, rank, nranks, end="Init START"):
        return (
            f"[default{local}]:gpu-b:4121:4190 [{local}] NCCL INFO comm 0x55d1c2a0b3f0 rank {rank} nranks {nranks} "
            f"cudaDev {local} nvmlDev {local} busId 4a000 commId 0x9f2e - {end}"
        )

    lines = [comm(2, 2, 8, "Init COMPLETE"), comm(2, 10, 16), comm(0, 8, 16, "Init COMPLETE"), TEE_OOM]
    _, verdict = triage_json(write(tmp_path, lines))
    assert (verdict["culprit_ranks"], verdict["confidence"]) == ([10], "high"), verdict["summary"]
    # Two nodes' local rank 2 in one file: whose line it is is not said. Where NCCL's line and torchrun's report
    # place local rank 2 apart (node 0's set-up, node 1's failure), the prefix places nothing; the report's one
    # failed rank, ended by the exception above it (exit 1), is the OOM's.
    _, merged = triage_json(write(tmp_path, [comm(2, 10, 16), comm(2, 2, 16), TEE_OOM]))
    assert merged["culprit_ranks"] == []
    report = ["Root Cause (first observed failure):", "[0]:", "  host      : gpu-b", "  rank      : 10 (local_rank: 2)"]
    _, apart = triage_json(write(tmp_path, [comm(2, 2, 16), TEE_OOM, *report, "  exitcode  : 1 (pid: 5512)"]))
    assert apart["culprit_ranks"] == [10], apart["summary"]


# ProcessGroupNCCL.cpp's watchdog (torch 2.4): each rank that timed out prints it, behind its own prefix.
WATCHDOG = (
    "[rank{0}]:[E1105 10:00:00.000000000 ProcessGroupNCCL.cpp:607] [Rank {0}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1042, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 "
    "milliseconds before timing out."
)
# torch/distributed/elastic/multiprocessing/api.py: the agent's own line, which carries no rank prefix
CLOSING = (
    "W1105 10:00:05.000000 2211 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 4121 closing "
    "signal SIGTERM"
)


def test_a_merged_log_named_after_a_rank_gives_that_rank_none_of_its_unprefixed_lines(tmp_path):
    # Ranks 0-2 and 4-7 timed out; rank 3 never enqueued the collective and printed nothing. The user named the file
    # after it: the agent's unprefixed line is no line of rank 3's, so rank 3 stays the silent one.
    lines = [*BANNER, *STEPS, *(WATCHDOG.format(r) for r in (0, 1, 2, 4, 5, 6, 7)), CLOSING]
    _, verdict = triage_json(write(tmp_path, lines, name="job_rank3.log"))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("nccl_timeout", [3]), verdict["summary"]
    _, neutral = triage_json(write(tmp_path, lines, name="job.log"))
    assert neutral["culprit_ranks"] == [3]


def test_a_per_rank_file_gives_its_rank_to_its_unprefixed_lines(tmp_path):
    # torchrun --log-dir / DeepSpeed --enable_each_rank_log: one rank's output per file, no prefix; its own prefix
    # (torch 2.2+'s "[rank3]:") where it has one is no other rank's.
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.1 GiB"
    )
    for name, lines in (("rank3.log", ["step 1 | loss 2.1", oom]), ("proc-3.out", ["[rank3]:step 1", oom])):
        _, verdict = triage_json(write(tmp_path, lines, name=name))
        assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", [3]), (name, verdict["summary"])


def report(entries):
    # torch/distributed/elastic/multiprocessing/errors/error_handler + ChildFailedError.format_msg: the root cause,
    # then any other failures, one block each.
    lines = ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "=" * 60, "main.py FAILED"]
    for index, (rank, code) in enumerate(entries):
        lines += ["-" * 60, "Root Cause (first observed failure):" if index == 0 else "Failures:", f"[{index}]:"]
        lines += ["  time      : 2024-06-20_14:00:14", "  host      : gpu-y02"]
        lines += [f"  rank      : {rank} (local_rank: {rank % 4})", f"  exitcode  : {code} (pid: {31188 + rank})"]
    return lines


def test_an_exception_without_a_rank_is_the_one_of_the_rank_the_report_below_it_names(tmp_path):
    # torch 1.13 prints no rank prefix: the OOM's traceback is the exception that ended the report's one rank (exit 1).
    oom = [
        "Traceback (most recent call last):",
        '  File "main.py", line 210, in <module>',
        "RuntimeError: CUDA out of memory. Tried to allocate 1.53 GiB (GPU 2; 31.75 GiB total capacity; 28.61 GiB "
        "already allocated; 1.10 GiB free; 29.51 GiB reserved in total by PyTorch)",
    ]
    _, verdict = triage_json(write(tmp_path, [*STEPS, *oom, *report([(6, 1)])]))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", [6]), verdict["summary"]
    # Two failed ranks, or a rank killed by a signal (its exception printed no traceback): whose lines they are is
    # not said.
    for entries in ([(6, 1), (5, 1)], [(6, -9)]):
        _, verdict = triage_json(write(tmp_path, [*STEPS, *oom, *report(entries)]))
        assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", []), (entries, verdict["summary"])


def test_of_two_uncaught_exceptions_without_a_rank_the_report_of_one_process_names_neither(tmp_path):
    # Two nodes' output merged without prefixes: an OOM's traceback (one node's rank), then another process's NCCL
    # error (its peer), then the report of the one rank that node's agent saw fail. A process ends of one uncaught
    # exception: which of the two was the report's rank's the log does not say (core generator seed 3031: the
    # report's rank 5 named for the OOM at high, truth rank 2). Chained, the two are one process's end.
    oom = [
        "Traceback (most recent call last):",
        '  File "main.py", line 210, in <module>',
        "RuntimeError: CUDA out of memory. Tried to allocate 1.53 GiB (GPU 2; 31.75 GiB total capacity; 28.61 GiB "
        "already allocated; 1.10 GiB free; 29.51 GiB reserved in total by PyTorch)",
    ]
    nccl = [
        "Traceback (most recent call last):",
        '  File "main.py", line 245, in <module>',
        "RuntimeError: NCCL error in: ../torch/lib/c10d/ProcessGroupNCCL.cpp:2297, unhandled system error, NCCL "
        "version 2.7.8",
    ]
    _, verdict = triage_json(write(tmp_path, [*STEPS, *oom, *nccl, *report([(6, 1)])]))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", []), verdict["summary"]
    chain = ["", "During handling of the above exception, another exception occurred:", ""]
    _, verdict = triage_json(write(tmp_path, [*STEPS, *oom, *chain, *nccl, *report([(6, 1)])]))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", [6]), verdict["summary"]


def test_a_merged_logs_name_changes_no_verdict_its_lines_decide(tmp_path):
    # A merged log holding other ranks' prefixes and torchrun's report: the report's entry names its rank, whatever
    # rank the user named the file after.
    closed = [
        f"[rank{r}]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        f"[10.0.0.{r}]:4242"
        for r in (0, 1)
    ]
    lines = [*BANNER, *STEPS, *closed, *report([(2, -11)])]
    verdicts = [triage_json(write(tmp_path, lines, name=name))[1] for name in ("job.log", "job_rank3.log")]
    assert [(v["category"], v["culprit_ranks"]) for v in verdicts] == [(verdicts[0]["category"], [2])] * 2


def srun_ended_step(terminating="srun: Terminating StepId=7604503.0"):
    # torch 1.9 under srun --label with NCCL_BLOCKING_WAIT: rank 1's wait raises once its communicator was aborted
    # (torch/csrc/distributed/c10d/NCCLUtils.hpp); srun then ends the step itself and the other tasks (Slurm src/srun:
    # "%s: task %s: Exited with exit code %d", "Terminating StepId=%s", strsignal's "Terminated").
    return [
        *[f"0: step {i} | loss {3.0 - i / 100:.2f}" for i in range(1, 6)],
        "1: Traceback (most recent call last):",
        '1:   File "/workspace/train.py", line 212, in main',
        "1:     dist.all_reduce(loss)",
        "1: RuntimeError: NCCL communicator was aborted.",
        "srun: error: node55: task 1: Exited with exit code 1",
        terminating,
        "slurmstepd: error: *** STEP 7604503.0 ON node55 CANCELLED AT 2025-07-25T18:52:48 ***",
        "srun: error: node55: tasks 0,2-7: Terminated",
    ]


def test_the_tasks_srun_ended_itself_were_running_so_none_left_first_and_its_cancel_is_no_schedulers(tmp_path):
    for terminating in (
        "srun: Terminating StepId=7604503.0",
        "srun: launch/slurm: _step_signal: Terminating StepId=7604503.0",
    ):
        _, verdict = triage_json(write(tmp_path, srun_ended_step(terminating)))
        assert (verdict["category"], verdict["culprit_ranks"]) == ("nccl_timeout", []), verdict["summary"]
        assert not verdict["summary"].startswith("The scheduler")
    # Without srun's account of the tasks it ended, rank 0 (below rank 1, in no failure line) is the one that left.
    lines = [line for line in srun_ended_step() if "Terminated" not in line]
    assert triage_json(write(tmp_path, lines))[1]["culprit_ranks"] == [0]


def test_the_tasks_srun_ended_count_among_the_ranks_that_printed_nothing(tmp_path):
    # srun --label (one task a rank): ranks 1-4 time out at one seq; srun then ends tasks 0 and 2-7. The job had eight
    # ranks, though 5-7 printed nothing: the silent ranks are 0 and 5-7, not rank 0 alone (core generator seed 15228:
    # rank 0 named, truth rank 6).
    timeout = (
        "{r}: [E ProcessGroupNCCL.cpp:2029] [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum="
        "54446, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800154 milliseconds before "
        "timing out."
    )
    lines = [
        "0: step 350 | loss 6.7795",
        *(timeout.format(r=r) for r in range(1, 5)),
        "srun: error: node37: task 1: Aborted",
        "srun: Terminating StepId=4916026.0",
        "srun: error: node37: tasks 0,2-7: Terminated",
    ]
    _, verdict = triage_json(write(tmp_path, lines))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("nccl_timeout", []), verdict["summary"]
    assert verdict["facts"]["candidates"] == [0, 5, 6, 7], verdict["summary"]


def test_srun_task_lists_are_read_whole_or_not_at_all():
    from torchtriage.sources.srun_tasks import SrunTasks, task_list

    assert task_list("0,2-5,9") == {0, 2, 3, 4, 5, 9}
    for garbled in ("5-2", "3-", "0,2-99999999999", "1-1048576", "0,,x"):
        assert task_list(garbled) == set(), garbled
    census = SrunTasks()
    census.read("srun: error: node1: tasks 0-3: Terminated")  # before srun said it ends the step: not its doing
    census.read("srun: Terminating StepId=12.0")
    census.read("srun: error: node1: task 5: Exited with exit code 1")  # an exit of its own, not srun's signal
    census.read("srun: error: node1: tasks 6,8: Killed")
    assert census.ended == {6, 8}
