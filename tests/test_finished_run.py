"""A job that finished: torchrun's agent reports that every worker exited 0 after the lines that look like failures
(torch/distributed/elastic/agent/server/api.py). Those lines did not end the job: the verdict is `ok` (exit 0),
and they are shown as symptoms it survived. The logs are written from the programs' format strings."""

from conftest import triage_json
from torchtriage import exit_codes

SUCCEEDED = (
    "I0219 04:10:00.101000 6209 torch/distributed/elastic/agent/server/api.py:864] [default] worker group "
    "successfully finished. Waiting 300 seconds for other agents to finish."
)
DONE = "I0219 04:10:00.102000 6209 torch/distributed/elastic/agent/server/api.py:931] Done waiting for other agents."
# c10's TORCH_WARN and an error a rank caught and went on from: lines that look like failures.
STORE_RETRY = (
    "[W728 15:01:59.562622567 TCPStore.cpp:340] [c10d] TCP client failed to connect/validate to host node-0:29500 - "
    "retrying (try=0, timeout=1800000ms, delay=496ms): Connection refused"
)
CAUGHT_OOM = (
    "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB. GPU 1 has a total capacity of "
    "79.19 GiB of which 1.02 GiB is free."
)
STEPS = [f"[rank0]: step {i} loss {3.0 - i / 100:.2f}" for i in range(50)]
CHILD_FAILED = [
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "============================================================",
    "train.py FAILED",
    "------------------------------------------------------------",
    "Root Cause (first observed failure):",
    "[0]:",
    "  time      : 2024-06-20_14:00:14",
    "  host      : node-0",
    "  rank      : 1 (local_rank: 1)",
    "  exitcode  : 1 (pid: 6602)",
]


def write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_lines_that_look_like_failures_before_the_launchers_success_did_not_end_the_job(tmp_path):
    path = write(tmp_path, "job.log", [STORE_RETRY, *STEPS[:20], CAUGHT_OOM, *STEPS[20:], SUCCEEDED, DONE])
    code, verdict = triage_json(path)
    assert (code, verdict["category"], verdict["culprit_ranks"]) == (exit_codes.OK, "ok", []), verdict["summary"]
    assert verdict["confidence"] == "medium"
    kinds = {f["kind"]: f["role"] for f in verdict["findings"]}
    assert kinds["logs.job_finished"] == "primary" and kinds["oom.cuda_allocator"] == "symptom"


def test_an_elastic_restart_the_job_recovered_from_is_survived(tmp_path):
    restart = (
        "I0219 03:10:00.000000 6209 torch/distributed/elastic/agent/server/api.py:889] [default] Worker group FAILED. "
        "3/3 attempts left; will restart worker group"
    )
    path = write(tmp_path, "job.log", [*STEPS[:10], CAUGHT_OOM, restart, *STEPS[10:], SUCCEEDED])
    assert triage_json(path)[1]["category"] == "ok"


def test_a_clean_log_that_ends_in_the_launchers_success_is_ok(tmp_path):
    code, verdict = triage_json(write(tmp_path, "job.log", [*STEPS, SUCCEEDED, DONE]))
    assert (code, verdict["category"]) == (exit_codes.OK, "ok")


def test_no_success_is_read_past_a_failure_after_it_or_a_launchers_failure_report(tmp_path):
    barrier = (
        "E0219 04:15:00.000000 6209 torch/distributed/elastic/agent/server/api.py:950] Error waiting on exit barrier. "
        "Elapsed: 300.1 seconds"
    )
    after = write(tmp_path, "after.log", [*STEPS, SUCCEEDED, CAUGHT_OOM, barrier])
    assert triage_json(after)[1]["category"] == "oom"
    reported = write(tmp_path / "..", "reported.log", [*STEPS, CAUGHT_OOM, SUCCEEDED, *CHILD_FAILED])
    assert triage_json(reported)[1]["category"] != "ok"


def test_a_ranks_own_log_without_a_success_of_its_own_keeps_its_failure(tmp_path):
    # The agent's success is in its own file; rank 1's file holds a failure and no report after it.
    write(tmp_path, "launcher.log", [*STEPS, SUCCEEDED])
    write(tmp_path, "rank1.log", [CAUGHT_OOM])
    code, verdict = triage_json(tmp_path)
    assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", [1])


def test_nccls_optional_plugin_probe_is_no_missing_library(tmp_path):
    # nccl src/plugin/plugin_open.cc: NCCL looks for libnccl-net.so and says, at INFO, it uses its own transport.
    probe = (
        "gpu1:4410:4410 [0] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such "
        "file or directory No plugin found (libnccl-net.so), using internal implementation"
    )
    code, verdict = triage_json(write(tmp_path, "job.log", [*STEPS[:5], probe, *STEPS[5:]]))
    assert verdict["category"] != "environment", verdict["summary"]
    missing = "ImportError: libnccl.so.2: cannot open shared object file: No such file or directory"
    assert triage_json(write(tmp_path, "import.log", [missing]))[1]["category"] == "environment"


def test_the_kills_after_a_scheduler_ended_the_job_are_its_not_an_out_of_memory_killers(tmp_path):
    # slurmstepd (src/slurmd/slurmstepd/req.c) reports the end, then signals every task: srun's "task N: Killed".
    cancelled = (
        "slurmstepd: error: *** STEP 771203.0 ON gpu-cc01 CANCELLED AT 2025-10-05T06:10:41 DUE TO TIME LIMIT ***"
    )
    killed = "srun: error: gpu-cc01: task 1: Killed"
    code, verdict = triage_json(write(tmp_path, "job.log", [*STEPS, cancelled, killed]))
    assert verdict["category"] != "host_oom" and verdict["culprit_ranks"] == [], verdict["summary"]
    assert any(f["kind"] == "logs.scheduler_cancelled" for f in verdict["findings"])
    # The same kill with no word from the scheduler is a kill of unknown cause, an out-of-memory kill the likeliest.
    assert triage_json(write(tmp_path, "bare.log", [*STEPS, killed]))[1]["category"] == "host_oom"


def test_a_step_srun_ended_itself_after_a_task_failed_is_that_tasks_failure_not_the_schedulers(tmp_path):
    # srun --kill-on-bad-exit (src/srun/launch.c _step_signal: "Terminating %ps"): task 1 ended with exit code 1,
    # srun ended the step, slurmstepd reports the step cancelled and srun the other tasks terminated.
    ended_by_srun = [
        "srun: error: gpu-cc01: task 1: Exited with exit code 1",
        "srun: Terminating StepId=771203.0",
        "slurmstepd: error: *** STEP 771203.0 ON gpu-cc01 CANCELLED AT 2025-10-05T06:10:41 ***",
        "srun: error: gpu-cc01: tasks 0,2-7: Terminated",
        "srun: Force Terminated StepId=771203.0",
    ]
    nan = ["1: Loss is nan, stopping training", "1: {'loss_ce': tensor(nan, device='cuda:1')}"]
    code, verdict = triage_json(write(tmp_path, "job.log", [*STEPS, *nan, *ended_by_srun]))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("nan_inf", [1]), verdict["summary"]
    # A step cancelled with no word from srun first (scancel, a time limit) is the scheduler's end.
    _, cancelled = triage_json(write(tmp_path, "cancelled.log", [*STEPS, *ended_by_srun[2:]]))
    assert cancelled["findings"][0]["kind"] == "logs.scheduler_cancelled", cancelled["summary"]


def test_deepspeeds_teardown_is_no_kill_where_its_exit_code_is_an_exceptions(tmp_path):
    # deepspeed/launcher/launch.py sigkill_handler: "Killing subprocess {pid}" for each rank, then
    # "{cmd} exits with return code = {code}": 1 is Python's uncaught exception, -9 a SIGKILL.
    head = "[2024-11-09 17:12:00,000] [{}] [launch.py:319:sigkill_handler] "
    kills = [head.format("INFO") + f"Killing subprocess {p}" for p in (5, 6)]
    code = head.format("ERROR") + "['python3', 'train.py'] exits with return code = {}"
    assert triage_json(write(tmp_path, "one.log", [*kills, code.format(1)]))[1]["category"] != "host_oom"
    assert triage_json(write(tmp_path, "kill.log", [*kills, code.format(-9)]))[1]["category"] == "host_oom"
    assert triage_json(write(tmp_path, "shell.log", [*kills, code.format(137)]))[1]["category"] == "host_oom"
    # A signal the process raises itself is its own error, no kill: SIGABRT (torch's watchdog taking the process
    # down after its timeout, C++'s terminate), SIGSEGV, SIGBUS, SIGILL, SIGFPE.
    for own in (-6, -11, -7, -4, -8):
        verdict = triage_json(write(tmp_path, f"own{own}.log", [*kills, code.format(own)]))[1]
        assert verdict["category"] != "host_oom", (own, verdict["summary"])


# deepspeed/launcher/launch.py: the node's header before it spawns, then one line per process that exits 0.
DS = "[2024-11-05 09:14:01,000] [INFO] [launch.py:{}:main] "
DS_HEADER = DS.format(146) + "nnodes={}, num_local_procs={}, node_rank={}"
DS_EXITED = DS.format(351) + "Process {} exits successfully."
FP16_OVERFLOW = "[rank0]: [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768"


def test_deepspeeds_launcher_finished_the_job_once_every_process_it_spawned_exited_0(tmp_path):
    exits = [DS_EXITED.format(41210 + i) for i in range(4)]
    done = write(tmp_path, "done.log", [DS_HEADER.format(1, 4, 0), *STEPS[:5], CAUGHT_OOM, *STEPS[5:], *exits])
    code, verdict = triage_json(done)
    assert (code, verdict["category"], verdict["confidence"]) == (exit_codes.OK, "ok", "medium"), verdict["summary"]
    lead = verdict["findings"][0]
    assert lead["kind"] == "logs.job_finished" and lead["evidence"][0]["text"].endswith(
        "Process 41213 exits successfully."
    )
    # One process of four unreported (it is still running, or the log was cut): nothing says the job finished.
    three = write(tmp_path, "three.log", [DS_HEADER.format(1, 4, 0), *STEPS, CAUGHT_OOM, *exits[:3]])
    assert triage_json(three)[1]["category"] == "oom"
    # Two nodes, only node 0's launcher in sight: node 1's processes are unaccounted for.
    half = write(tmp_path, "half.log", [DS_HEADER.format(2, 4, 0), *STEPS, CAUGHT_OOM, *exits])
    assert triage_json(half)[1]["category"] == "oom"
    # A second launch of the same node (a restart in the same file) counts its processes anew.
    again = [DS_HEADER.format(1, 4, 0), *exits[:2], CAUGHT_OOM, DS_HEADER.format(1, 4, 0), *exits[2:]]
    assert triage_json(write(tmp_path, "again.log", again))[1]["category"] == "oom"


def test_the_jobs_own_words_that_training_ended_outweigh_lines_it_survived_at_low_confidence(tmp_path):
    # fairseq_cli/train.py "done training in {:.1f} seconds"; HF Trainer.train's final metrics; Megatron-LM's
    # print_datetime('after training is done'); Lightning's fit loop.
    endings = [
        "2025-02-03 01:00:12 | INFO | fairseq_cli.train | done training in 3612.4 seconds",
        "{'train_runtime': 5123.4, 'train_samples_per_second': 12.5, 'train_steps_per_second': 0.39, 'epoch': 3.0}",
        "[after training is done] datetime: 2024-05-06 07:08:09 ",
        "`Trainer.fit` stopped: `max_epochs=3` reached.",
    ]
    for index, ending in enumerate(endings):
        path = write(tmp_path, f"job{index}.log", [*STEPS[:10], FP16_OVERFLOW, CAUGHT_OOM, *STEPS[10:], ending])
        code, verdict = triage_json(path)
        assert (code, verdict["category"], verdict["confidence"]) == (exit_codes.OK, "ok", "low"), ending
        kinds = {f["kind"]: f["role"] for f in verdict["findings"]}
        assert kinds["logs.training_completed"] == "primary" and kinds["oom.cuda_allocator"] == "symptom"
    # A failure after those words (at exit, saving the last checkpoint) is the job's failure.
    late = write(tmp_path, "late.log", [*STEPS, endings[0], CAUGHT_OOM])
    assert triage_json(late)[1]["category"] == "oom"


def test_one_ranks_words_that_training_ended_do_not_cover_another_ranks_file(tmp_path):
    write(tmp_path, "rank0.log", [*STEPS, "Training completed. Do not forget to share your model on huggingface.co"])
    write(tmp_path, "rank1.log", [CAUGHT_OOM])
    code, verdict = triage_json(tmp_path)
    assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", [1])


XID_63 = (
    "[5100231.882114] NVRM: Xid (PCI:0000:2a:00): 63, pid=50121, name=python3, Row Remapper: New row marked for "
    "remapping, reset gpu to activate."
)


def test_the_nodes_driver_lines_after_the_launchers_success_are_its_health_not_the_jobs_failure(tmp_path):
    # The kernel's lines (dmesg appended to the job's log) follow no order of the job's: workers that all exited 0
    # were not ended by them. The Xid stays in sight, as a symptom.
    code, verdict = triage_json(write(tmp_path, "job.log", [*STEPS, SUCCEEDED, DONE, XID_63]))
    assert (code, verdict["category"], verdict["confidence"]) == (exit_codes.OK, "ok", "medium"), verdict["summary"]
    assert {f["kind"]: f["role"] for f in verdict["findings"]}["gpu_fault.xid_other"] == "symptom"
    # A separate dmesg file needs no report of its own.
    (tmp_path / "dir").mkdir()
    write(tmp_path / "dir", "launcher.log", [*STEPS, SUCCEEDED])
    write(tmp_path / "dir", "dmesg.txt", [XID_63])
    assert triage_json(tmp_path / "dir")[1]["category"] == "ok"
    # The job's own words are one process's: a driver's line after them keeps its verdict.
    words = write(tmp_path, "words.log", [*STEPS, "Training completed.", XID_63])
    assert triage_json(words)[1]["category"] == "gpu_fault"


def test_a_loss_that_stayed_non_finite_to_the_end_is_no_finished_job(tmp_path):
    # A job that trained on NaN to its last step and exited 0 finished nothing worth having: the NaN is a state of
    # training, survived only where a finite loss follows it in its file.
    nan_steps = [f"[rank0]: step {i} loss nan" for i in range(50, 60)]
    nan_at = "[rank0]: Loss is nan, stopping training"
    for ending in ([SUCCEEDED, DONE], ["Training completed."]):
        stuck = write(tmp_path, "stuck.log", [*STEPS, nan_at, *nan_steps, *ending])
        assert triage_json(stuck)[1]["category"] == "nan_inf", ending
        healed = write(tmp_path, "healed.log", [*STEPS[:10], nan_at, *STEPS[10:], *ending])
        assert triage_json(healed)[1]["category"] == "ok", ending
    # HF's Trainer: every logged step's gradient norm NaN to the end; the closing summary's train_loss averages
    # every step, the NaN ones too, and is no step of training that went on.
    hf = [f"{{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 3.0e-06, 'epoch': {i / 10}}}" for i in range(1, 30)]
    summary = "{'train_runtime': 7391.2, 'train_samples_per_second': 21.1, 'train_loss': 0.2617, 'epoch': 3.0}"
    assert triage_json(write(tmp_path, "hf.log", [*hf, summary]))[1]["category"] == "nan_inf"


def test_a_failure_a_program_logged_as_a_warning_and_trained_on_after_is_no_cause_of_a_later_one(tmp_path):
    # fairseq/trainer.py: a caught OOM is logged at WARNING ("OOM: Ran out of memory with exception: ..."), then
    # "attempting to recover from OOM"; its train_inner lines go on. Rank 5's illegal memory access later ends the job.
    head = "[rank0]:2025-11-06 09:31:40 | WARNING | fairseq.trainer | "
    caught = [
        head + "OOM: Ran out of memory with exception: CUDA out of memory. Tried to allocate 3.91 GiB. GPU 0 has a "
        "total capacity of 79.10 GiB of which 2.11 GiB is free.",
        head + "attempting to recover from OOM in forward/backward pass",
    ]
    inner = [
        f"[rank0]:2025-11-06 09:{35 + i}:00 | INFO | train_inner | epoch 001:   {100 * i} / 21440 "
        f"loss={7.2 - i / 20:.3f}, nll_loss=6.900, num_updates={100 * i}"
        for i in range(1, 10)
    ]
    ima = [
        "[rank5]:Traceback (most recent call last):",
        '[rank5]:  File "/workspace/train.py", line 121, in train_step',
        "[rank5]:    loss.backward()",
        "[rank5]:RuntimeError: CUDA error: an illegal memory access was encountered",
    ]
    _, verdict = triage_json(write(tmp_path, "job.log", [*caught, *inner, *ima]))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("gpu_fault", [5]), verdict["summary"]
    # Without the training that went on after it, the warned OOM is where the job's trouble began.
    _, unsure = triage_json(write(tmp_path, "short.log", [*caught, *ima]))
    assert unsure["category"] == "oom", unsure["summary"]


def test_a_scheduler_that_ends_a_step_for_its_memory_says_host_oom(tmp_path):
    # Slurm's jobacct_gather polls the step's RSS: "%ps exceeded memory limit (%lu > %lu), being killed", then
    # slurmstepd cancels the step and srun reports its tasks killed.
    lines = [
        *STEPS,
        "slurmstepd: error: Step 6613.0 exceeded memory limit (262183404 > 262144000), being killed",
        "slurmstepd: error: *** STEP 6613.0 ON gpu-node-06 CANCELLED AT 2025-03-10T08:17:31 ***",
        "srun: error: gpu-node-06: task 0: Killed",
    ]
    code, verdict = triage_json(write(tmp_path, "job.log", lines))
    assert (code, verdict["category"]) == (exit_codes.PROBLEM_FOUND, "host_oom"), verdict["summary"]


# deepspeed/runtime/fp16/loss_scaler.py DynamicLossScaler.update_scale: the scale starts at 2^initial_scale_power
# and halves on each overflow of the first steps (logged at INFO by rank 0), then settles.
def _overflows(scales: list[int], minute: int = 1) -> list[str]:
    return [
        f"[2025-11-06 09:0{minute}:{10 + i:02d},233] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! "
        f"Rank 0 Skipping step. Attempted loss scale: {scale}, reducing to {scale // 2}"
        for i, scale in enumerate(scales)
    ]


# A job stopped with Ctrl-C while it waited in a collective (torch/distributed/distributed_c10d.py all_reduce).
INTERRUPTED = [
    "^C",
    "Traceback (most recent call last):",
    '  File "/workspace/train.py", line 88, in <module>',
    "    dist.all_reduce(loss)",
    '  File "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", line 1842, in all_reduce',
    "    work.wait()",
    "KeyboardInterrupt",
]
STEPS_AFTER = [f"step {i} | loss {4.9 - i / 100:.4f} | lr 2.5e-04" for i in range(5, 60, 5)]


def test_a_loss_scalers_calibration_that_training_went_on_after_names_no_failure(tmp_path):
    # The warm-up's overflows, then steps with finite losses, then a job interrupted in a collective: the overflows
    # are no failure of their own (they were the verdict, at medium: "fp16 gradient overflow"), the stop is.
    log = [*_overflows([2**32, 2**31, 2**30]), *STEPS_AFTER, *INTERRUPTED]
    _, verdict = triage_json(write(tmp_path, "job.log", log))
    assert verdict["category"] == "hang", verdict["summary"]
    shown = {f["kind"]: f["role"] for f in verdict["findings"]}
    assert shown.get("nan_inf.loss_scale_overflow") == "collateral"
    _, stopped = triage_json(write(tmp_path, "stopped.log", log[: -len(INTERRUPTED)]))
    assert stopped["category"] == "hang", stopped["summary"]


def test_overflows_to_the_end_of_training_are_still_the_failure(tmp_path):
    # The scale halving step after step with one loss line after the last overflow: not settled, so not survived.
    halving = _overflows([2**k for k in range(16, 6, -1)], minute=2)
    log = [*STEPS_AFTER, *halving, "step 65 | loss 4.2000 | lr 2.5e-04", *INTERRUPTED]
    _, verdict = triage_json(write(tmp_path, "job.log", log))
    assert verdict["category"] == "nan_inf", verdict["summary"]
