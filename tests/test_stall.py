"""The lowest layer of triage: logs that show no error, only where a stalled job stopped.

Every log here is written from the formats of the programs that print it: CPython's traceback and
faulthandler (Python/traceback.c), py-spy's `dump` (src/dump.rs), gdb's `backtrace`, torchrun's agent
(torch/distributed/elastic/agent/server/api.py), tqdm's bar, NCCL's INFO lines (src/init.cc).
"""

import gzip

import pytest

from conftest import triage_json
from torchtriage import exit_codes

SITE = "/usr/lib/python3.11/site-packages"
C10D = f"{SITE}/torch/distributed/distributed_c10d.py"


def write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def interrupted_in_all_reduce(rank):
    return [
        f"[rank{rank}]: Traceback (most recent call last):",
        f'[rank{rank}]:   File "/job/train.py", line 90, in <module>',
        f"[rank{rank}]:     main()",
        f'[rank{rank}]:   File "/job/train.py", line 63, in main',
        f"[rank{rank}]:     dist.all_reduce(loss)",
        f'[rank{rank}]:   File "{SITE}/torch/distributed/c10d_logger.py", line 83, in wrapper',
        f"[rank{rank}]:     return func(*args, **kwargs)",
        f'[rank{rank}]:   File "{C10D}", line 2501, in all_reduce',
        f"[rank{rank}]:     work.wait()",
        f"[rank{rank}]: KeyboardInterrupt",
    ]


def interrupted_in_dataloader(rank):
    loader = f"{SITE}/torch/utils/data/dataloader.py"
    return [
        f"[rank{rank}]: Traceback (most recent call last):",
        f'[rank{rank}]:   File "/job/train.py", line 90, in <module>',
        f"[rank{rank}]:     main()",
        f'[rank{rank}]:   File "/job/train.py", line 58, in main',
        f"[rank{rank}]:     batch = next(it)",
        f'[rank{rank}]:   File "{loader}", line 631, in __next__',
        f"[rank{rank}]:     data = self._next_data()",
        f'[rank{rank}]:   File "{loader}", line 1328, in _next_data',
        f"[rank{rank}]:     idx, data = self._get_data()",
        f'[rank{rank}]:   File "{loader}", line 1294, in _get_data',
        f"[rank{rank}]:     success, data = self._try_get_data()",
        f'[rank{rank}]:   File "/usr/lib/python3.11/threading.py", line 331, in wait',
        f"[rank{rank}]:     gotit = waiter.acquire(True, timeout)",
        f"[rank{rank}]: KeyboardInterrupt",
    ]


def test_ctrl_c_on_a_stuck_job_names_the_rank_that_is_not_where_the_others_wait(tmp_path):
    agent = "W1201 10:00:00.000000 611 torch/distributed/elastic/agent/server/api.py:704]"
    lines = [f"{agent} Received 2 death signal, shutting down workers"]
    for rank in range(4):
        lines += interrupted_in_dataloader(rank) if rank == 2 else interrupted_in_all_reduce(rank)
    code, verdict = triage_json(write(tmp_path, "job.log", lines))
    assert (code, verdict["category"], verdict["culprit_ranks"]) == (exit_codes.PROBLEM_FOUND, "hang", [2])
    kinds = [f["kind"] for f in verdict["findings"]]
    assert kinds[0] == "hang.interrupted" and "stacks.not_in_collective" in kinds
    assert verdict["confidence"] != "high"  # an interrupted paste is not a live dump of every rank
    assert "KeyboardInterrupt" not in verdict["summary"]  # the interrupt is how it stopped, not why


def test_one_interrupted_rank_says_where_it_waited_and_blames_nobody(tmp_path):
    code, verdict = triage_json(write(tmp_path, "rank0.log", ["^C", *interrupted_in_all_reduce(0)]))
    assert (code, verdict["category"], verdict["culprit_ranks"]) == (exit_codes.PROBLEM_FOUND, "hang", [])
    dump = next(f for f in verdict["findings"] if f["kind"] == "hang.stack_dump")
    assert "waits in all_reduce, called from main at /job/train.py:63" in dump["message"]


def test_a_faulthandler_dump_of_a_stuck_rank_is_read_innermost_first(tmp_path):
    lines = [
        "step 811 loss 2.113",
        "Timeout (0:05:00)!",
        "Thread 0x00007f3cc367c6c0 (most recent call first):",
        f'  File "{SITE}/torch/cuda/__init__.py", line 1040 in synchronize',
        '  File "/job/train.py", line 71 in step',
        '  File "/job/train.py", line 90 in <module>',
    ]
    code, verdict = triage_json(write(tmp_path, "rank5.log", lines))
    assert (verdict["category"], verdict["confidence"]) == ("hang", "medium")
    dump = next(f for f in verdict["findings"] if f["kind"] == "hang.stack_dump")
    assert "waits for the GPU in torch.cuda.synchronize, called from step at /job/train.py:71" in dump["message"]
    assert dump["ranks"] == [5]  # the rank from the file's name


def test_a_pasted_py_spy_dump_prefers_the_thread_that_waits(tmp_path):
    lines = [
        "step 12 loss 3.02",  # a log that the dump was pasted into
        "Process 4242: python train.py --steps 1000",
        "Python v3.11.7 (/usr/bin/python3.11)",
        "",
        'Thread 4242 (idle): "MainThread"',
        "    wait (threading.py:327)",
        "    get (queue.py:171)",
        "    main (train.py:40)",
        'Thread 4250 (idle): "Thread-1 (pin_memory)"',
        "    select (selectors.py:415)",
    ]
    code, verdict = triage_json(write(tmp_path, "dump.txt", lines))
    assert verdict["category"] == "hang"
    dump = next(f for f in verdict["findings"] if f["kind"] == "hang.stack_dump")
    assert "blocked on a lock (wait) in main at train.py:40" in dump["message"]


def test_a_gdb_backtrace_inside_a_device_copy_is_a_wait_for_the_gpu(tmp_path):
    lines = (
        ["(gdb) bt"]
        + [f"#{n}  0x000014cd955ebd{n:02x} in ?? () from /lib64/libcuda.so.1" for n in range(4)]
        + [
            "#4  0x000014cdd8a6cf36 in cudaMemcpyAsync () from /usr/local/cuda/lib64/libcudart.so.12",
            "#5  0x000014cdb53ae194 in at::native::_local_scalar_dense_cuda(at::Tensor const&) ()",
            "   from /opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so",
            "#6  0x000014cdb53af000 in at::_ops::_local_scalar_dense::call(at::Tensor const&) ()",
        ]
    )
    code, verdict = triage_json(write(tmp_path, "gdb.txt", lines))
    assert verdict["category"] == "hang"
    dump = next(f for f in verdict["findings"] if f["kind"] == "hang.stack_dump")
    assert "gdb stack" in dump["message"] and "for the GPU in cudaMemcpyAsync" in dump["message"]


def test_a_launcher_stuck_in_waitpid_with_its_frame_lines_wrapped(tmp_path):
    launch = f"{SITE}/torch/distributed/launch.py"
    lines = [
        f'  File "{launch}", line 235,',
        " in <module>",
        "    main()",
        f'  File "{launch}", line 228,',
        " in main",
        "    process.wait()",
        '  File "/usr/lib/python3.11/subprocess.py", line 1264, in wait',
        "    return self._wait(timeout=timeout)",
        '  File "/usr/lib/python3.11/subprocess.py", line 2046, in _wait',
        "    (pid, sts) = self._try_wait(0)",
        '  File "/usr/lib/python3.11/subprocess.py", line 2004, in _try_wait',
        "    (pid, sts) = os.waitpid(self.pid, wait_flags)",
    ]
    code, verdict = triage_json(write(tmp_path, "launcher.log", lines))
    assert verdict["category"] == "hang"
    dump = next(f for f in verdict["findings"] if f["kind"] == "hang.stack_dump")
    assert "blocked in _try_wait" in dump["message"]


def test_a_log_that_stops_after_a_progress_bar_is_a_hang_of_low_confidence(tmp_path):
    lines = ["[2026-12-01 04:53:37] Beginning epoch 0...", "Epoch 0:   0%|          | 0/1234 [00:00<?, ?it/s]"]
    code, verdict = triage_json(write(tmp_path, "train.log", lines))
    assert (code, verdict["category"], verdict["confidence"]) == (exit_codes.PROBLEM_FOUND, "hang", "low")
    assert "stops after a progress bar" in verdict["summary"]


def test_a_finished_job_is_not_a_stall(tmp_path):
    lines = ["Epoch 9: 100%|##########| 1234/1234 [10:00<00:00, 2.05it/s]", "Training completed."]
    code, verdict = triage_json(write(tmp_path, "train.log", lines))
    assert (code, verdict["category"], verdict["confidence"]) == (exit_codes.OK, "ok", "low")
    assert [(f["kind"], f["evidence"][0]["line"]) for f in verdict["findings"]] == [("logs.training_completed", 2)]


def test_a_failure_no_rule_knows_is_not_called_a_stall(tmp_path):
    lines = [
        "step 3 loss 1.2",
        "terminate called after throwing an instance of 'c10::Error'",
        f"frame #3: <unknown function> + 0x5bab84a (0x7fadd1edf84a in {SITE}/torch/lib/libtorch_cpu.so)",
    ]
    code, verdict = triage_json(write(tmp_path, "rank0.log", lines))
    assert verdict["category"] != "hang"


@pytest.mark.parametrize(
    "exception",
    [
        "torch._dynamo.exc.Unsupported: call_function UserDefinedObjectVariable(step) [] {}",
        "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 262144",
        "torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode: Could not guard on u0 < 4",
    ],
)
def test_an_exception_line_of_any_name_is_a_failure_not_a_stall(tmp_path, exception):
    # Python prints an exception from outside builtins as its module, its class, a colon (traceback's
    # format_exception_only), whatever the class is called.
    code, verdict = triage_json(write(tmp_path, "rank0.log", ["step 3 loss 1.2", exception]))
    assert verdict["category"] != "hang" and exception[:40] in verdict["summary"]


def test_a_timing_line_named_like_a_class_is_where_a_log_stopped_not_a_failure(tmp_path):
    code, verdict = triage_json(write(tmp_path, "rank0.log", ["step 3 loss 1.2", "Trainer.Step: 1.2 s"]))
    assert verdict["category"] == "hang" and verdict["confidence"] != "high"


def test_a_segfault_dump_is_a_crash_not_a_stall(tmp_path):
    lines = [
        "step 3 loss 1.2",
        "Fatal Python error: Segmentation fault",
        "",
        "Current thread 0x00007f3cc43e3b80 (most recent call first):",
        '  File "/job/train.py", line 71 in step',
    ]
    code, verdict = triage_json(write(tmp_path, "rank1.log", lines))
    assert verdict["category"] != "hang"


def test_a_real_error_keeps_its_category_when_the_job_was_also_interrupted(tmp_path):
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79 GiB"
    code, verdict = triage_json(write(tmp_path, "job.log", [f"[rank3]: {oom}", "^C", *interrupted_in_all_reduce(0)]))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", [3])


def test_the_stall_layer_reads_gzip_and_stdin_alike(tmp_path):
    lines = ["NCCL INFO Bootstrap : Using eth0:10.0.0.5<0>", "node1:100:200 [0] NCCL INFO Channel 00/02 :    0   1"]
    (tmp_path / "train.log.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    code, verdict = triage_json(tmp_path / "train.log.gz")
    assert verdict["category"] == "hang" and "NCCL's set-up" in verdict["summary"]


def test_an_unknown_failure_says_what_it_saw(tmp_path):
    lines = [
        "    output = self._load_state_dict(state_dict, strict)",  # the paste starts inside a traceback
        "[rank2]: step 3 loss 1.2",
        "[rank2]: terminate called after throwing an instance of 'c10::Error'",
    ]
    code, verdict = triage_json(write(tmp_path, "rank2.log", lines))
    assert (code, verdict["category"], verdict["confidence"]) == (exit_codes.PROBLEM_FOUND, "unknown", "low")
    (finding,) = verdict["findings"]
    assert finding["kind"] == "logs.unrecognised_failure" and finding["ranks"] == [2]
    assert verdict["facts"]["cut_at_start"] is True and verdict["facts"]["ranks_seen"] == [2]
    assert "no rule knows" in verdict["summary"]


def test_a_census_names_the_ranks_of_the_world_that_printed_nothing_as_candidates(tmp_path):
    init = "[rank{r}]: node1:100:20{r} [{r}] NCCL INFO comm 0x556{r} rank {r} nranks 4 cudaDev {r} - Init COMPLETE"
    lines = [init.format(r=r) for r in (0, 1, 3)] + ["[rank0]: Epoch 0:   0%|          | 0/1234 [00:00<?, ?it/s]"]
    code, verdict = triage_json(write(tmp_path, "job.log", lines))
    assert (verdict["category"], verdict["culprit_ranks"], verdict["confidence"]) == ("hang", [], "low")
    assert verdict["facts"]["candidates"] == [2] and verdict["facts"]["world_size"] == 4
    assert "rank 2 printed nothing" in verdict["summary"]


def test_a_warning_the_job_carried_on_after_does_not_hide_the_stall(tmp_path):
    lines = [
        "[W socket.cpp:663] [c10d] The client socket has failed to connect to [localhost]:29500 "
        "(errno: 99 - Cannot assign requested address).",
        "Epoch 0:   3%|3         | 40/1234 [00:10<05:00, 4.0it/s]",
    ]
    code, verdict = triage_json(write(tmp_path, "train.log", lines))
    assert (verdict["category"], verdict["confidence"]) == ("hang", "low")
    warned = next(f for f in verdict["findings"] if f["kind"].startswith("rendezvous."))
    assert warned["role"] == "collateral"


def test_a_log_that_stops_at_a_warning_a_rule_knows_keeps_that_warning(tmp_path):
    warning = (
        "[W socket.cpp:601] [c10d] The IPv6 network addresses of (node-7, 53821) cannot be retrieved "
        "(gai error: -3 - Temporary failure in name resolution)."
    )
    code, verdict = triage_json(write(tmp_path, "train.log", [warning]))
    assert (verdict["category"], verdict["confidence"]) == ("rendezvous", "low")


def test_after_ctrl_c_the_ranks_that_printed_a_stack_outside_a_collective_are_the_candidates(tmp_path):
    sleeping = [
        "[default1]:Traceback (most recent call last):",
        '[default1]:  File "/job/hang.py", line 140, in <module>',
        "[default1]:    culprit_skip(tensor)",
        '[default1]:  File "/job/hang.py", line 67, in culprit_skip',
        "[default1]:    time.sleep(FOREVER_S)",
        "[default1]:KeyboardInterrupt",
    ]
    agent = "W1201 10:00:00.000000 611 torch/distributed/elastic/agent/server/api.py:704]"
    lines = ["[default0]:READY rank=0 pid=100", "[default1]:READY rank=1 pid=101"]
    lines += [f"{agent} Received Signals.SIGINT death signal, shutting down workers", *sleeping]
    code, verdict = triage_json(write(tmp_path, "job.log", lines))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("hang", [])
    assert verdict["facts"]["candidates"] == [1]
    outside = next(f for f in verdict["findings"] if f["kind"] == "hang.interrupted_outside_collective")
    assert "rank 0 printed nothing" in outside["message"]


def test_a_stall_in_a_log_that_starts_mid_message_says_its_beginning_is_missing(tmp_path):
    lines = ["    output = self.module(*inputs)", "Epoch 0:   0%|          | 0/1234 [00:00<?, ?it/s]"]
    code, verdict = triage_json(write(tmp_path, "train.log", lines))
    assert (verdict["category"], verdict["confidence"], verdict["facts"]["cut_at_start"]) == ("hang", "low", True)
    assert "starts mid-message" in verdict["summary"]


def test_a_loss_that_grows_by_orders_of_magnitude_is_a_divergence_and_a_noisy_one_is_not(tmp_path):
    step = "Epoch [6][{i}/3681]  lr: 0.02000, time: 0.8, loss_cls: 0.25, loss: {loss}"
    exploding = [step.format(i=i, loss=loss) for i, loss in enumerate([0.62, 1.01, 0.58, 0.7, 225192.61, 1.7e10])]
    code, verdict = triage_json(write(tmp_path, "diverged.log", exploding))
    assert (verdict["category"], verdict["confidence"]) == ("nan_inf", "low")
    assert verdict["findings"][0]["kind"] == "nan_inf.loss_diverged"
    noisy = [step.format(i=i, loss=loss) for i, loss in enumerate([2.3, 2.1, 2.4, 9.8, 2.0, 1.9])]
    code, verdict = triage_json(write(tmp_path, "noisy.log", noisy))
    assert verdict["category"] == "hang"  # a log that just stops, not a divergence


def test_a_log_that_stops_after_a_python_warning_names_the_warning_not_its_source_echo(tmp_path):
    # Lib/warnings.py prints "file:line: Category: message", then the source line it points at, indented.
    log = write(
        tmp_path,
        "run.log",
        [
            "step 40 loss 2.113",
            f"{SITE}/torch/profiler/profiler.py:224: UserWarning: Profiler clears events at the end of each cycle.",
            "  _warn_once(",
        ],
    )
    code, verdict = triage_json(log)
    assert (code, verdict["category"], verdict["confidence"]) == (exit_codes.PROBLEM_FOUND, "hang", "low")
    assert "stops after a warning" in verdict["summary"]
    assert "UserWarning: Profiler clears events" in verdict["summary"]
