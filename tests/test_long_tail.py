"""The long tail of triage: non-finite values without a keyword, the signals other launchers report, NCCL's
connection lines where a log ends on them, rendezvous beyond TCPStore's messages, and tracebacks known by
their frames.

The logs are written here from the format strings the rules cite (made-up values), generated from seeds
where a property must hold for every shape: NaN as a cell of a CSV row or a step line, a loss scale that
halves to the end or recovers, healthy numbers that only look like NaN/Inf. Every log goes through a
real file and `torchtriage triage`'s own code path.
"""

import random

import pytest

from conftest import triage_json
from torchtriage.analysis.nonfinite_values import read_nonfinite_values, reading_of
from torchtriage.analysis.pipeline import matcher_for, triage_paths
from torchtriage.knowledge.linear_regex import is_linear
from torchtriage.sources.log_records import read_logs
from torchtriage.sources.registry import discover

SEEDS = range(24)
PREFIXES = ("", "[rank3]:", "  3: ", "[1,3]<stderr>:", "[2026-11-30 04:32:11,123] ")


def triage(tmp_path, text: str, name: str = "job.log"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return triage_paths([str(path)])


def kinds(verdict) -> set[str]:
    return {f.kind for f in verdict.findings}


def healthy_steps(rng: random.Random, count: int, prefix: str = "") -> list[str]:
    return [f"{prefix}step {i:>6} | loss: {2 + rng.random():.4f} | grad_norm: {rng.random():.3f}" for i in range(count)]


# -- non-finite values without a keyword ----------------------------------------------------------------


def csv_log(rng: random.Random, nan_rows: int) -> str:
    columns = rng.randint(3, 8)
    names = ["step"] + [rng.choice(("loss", "acc", "ppl", "lr", "val", "kl")) + str(c) for c in range(columns - 1)]
    rows = [",".join(names)]
    for step in range(rng.randint(3, 30)):
        rows.append(",".join([str(step)] + [f"{rng.uniform(-5, 5):.{rng.randint(1, 6)}f}" for _ in names[1:]]))
    start = len(rows) - 1
    for step in range(start, start + nan_rows):
        cells = [f"{rng.uniform(0, 3):.4f}" for _ in names[1:]]
        for index in rng.sample(range(len(cells)), rng.randint(1, len(cells))):
            cells[index] = rng.choice(("nan", "NaN", "-nan", "inf", "-inf"))
        rows.append(",".join([str(step)] + cells))
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize("seed", SEEDS)
def test_nan_cells_of_a_csv_row_are_a_non_finite_verdict(tmp_path, seed):
    rng = random.Random(seed)
    prefix = rng.choice(PREFIXES)
    text = "".join(f"{prefix}{line}\n" for line in csv_log(rng, rng.randint(1, 5)).splitlines())
    verdict = triage(tmp_path, text)
    assert verdict.category == "nan_inf", (text, verdict.summary)
    assert "nan_inf.nonfinite_value" in kinds(verdict)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_step_line_whose_value_is_nan_is_a_non_finite_verdict(tmp_path, seed):
    rng = random.Random(seed)
    prefix = rng.choice(PREFIXES)
    steps = [f"{prefix}{i} {2 + rng.random():.4f}" for i in range(77000, 77000 + rng.randint(2, 40))]
    bad = [f"{prefix}{i} {rng.choice(('nan', 'NaN', 'nan nan'))}" for i in range(77100, 77100 + rng.randint(1, 4))]
    after = [f"{prefix}{i} nan" for i in range(77200, 77200 + rng.randint(0, 3))]
    verdict = triage(tmp_path, "\n".join(steps + bad + after) + "\n")
    assert verdict.category == "nan_inf", verdict.summary
    evidence = [e.text for f in verdict.findings if f.kind == "nan_inf.nonfinite_value" for e in f.evidence]
    assert evidence and evidence[0].endswith(bad[0].split()[-1]), evidence  # the first line that went non-finite


@pytest.mark.parametrize(
    "line",
    [
        "Epoch: [115]  [1298/1299]  lr: 0.001435  loss: 6.5993 (6.5971)  grad_norm: 0.3922 (nan)  time: 0.4944",
        "step:1 - critic/kl:-0.000 - critic/vpred_mean:nan - mfu/critic:0.036",
        '{"epoch": 3, "train_ppl": "inf", "lr": 0.0003}',
        "{'eval_loss': nan, 'eval_runtime': 12.3, 'epoch': 1.0}",
        "| 1200 | nan | 0.31 | 4.5e-05 |",
        "tensor([0.3100, nan, 1.2000], device='cuda:0')",
    ],
)
def test_a_metric_holding_nan_is_read_wherever_it_stands(tmp_path, line):
    rng = random.Random(line)
    text = "\n".join(healthy_steps(rng, 5) + [line] + healthy_steps(rng, 3)) + "\n"
    assert reading_of(line) is not None and reading_of(line).strong
    verdict = triage(tmp_path, text)
    assert verdict.category == "nan_inf", verdict.summary


HEALTHY_LINES = [
    "step 120 | nan_count: 0 | inf_count: 0 | loss: 2.3100",
    "forward took 81234 nanoseconds, backward 160021 nanoseconds",
    "INFO infer: 512 samples in 3.2s",
    "NCCL INFO NET/IB : No device found.",
    "iteration 1200/5000 | lm loss: 2.1 | number of skipped iterations:   0 | number of nan iterations:   0 |",
    "Namespace(clip_norm=inf, max_tokens=inf, threshold_loss_scale=None, lr=0.0005)",
    "{'best_loss': inf, 'min_val_loss': inf, 'patience': 3}",
    "attention mask: tensor([[0., -inf, -inf], [0., 0., -inf]])",
    "Financial report: nan-free dataset, infinity pool",
    "loss_scale_window: 1000, min_loss_scale: 1, initial_loss_scale: 4294967296",
]


@pytest.mark.parametrize("line", HEALTHY_LINES)
def test_healthy_numbers_are_not_read_as_non_finite(tmp_path, line):
    reading = reading_of(line)
    assert reading is None or not reading.strong, reading
    rng = random.Random(line)
    # In the middle of a healthy log: the log stops on an ordinary step line.
    text = "\n".join(healthy_steps(rng, 6) + [line] + healthy_steps(rng, 6)) + "\n"
    verdict = triage(tmp_path, text)
    assert verdict.category != "nan_inf", verdict.summary


@pytest.mark.parametrize("seed", SEEDS)
def test_generated_healthy_logs_with_look_alike_words_are_never_non_finite(tmp_path, seed):
    rng = random.Random(seed)
    lines = healthy_steps(rng, rng.randint(3, 30), rng.choice(PREFIXES))
    for _ in range(rng.randint(1, 6)):
        lines.insert(rng.randrange(len(lines)), rng.choice(HEALTHY_LINES))
    lines += healthy_steps(rng, 2)
    verdict = triage(tmp_path, "\n".join(lines) + "\n")
    assert verdict.category != "nan_inf", (lines, verdict.summary)


def fairseq_lines(scales: list[float], prefix: str = "") -> list[str]:
    return [
        f"{prefix}| epoch 003:  {i * 100:>5} / 9000 loss=4.{i % 10}, nll_loss=3.1, ppl=8.6, wps=9012, "
        f"num_updates={i * 100}, lr=0.0005, gnorm=0.61, loss_scale={scale:g}, wall=1234"
        for i, scale in enumerate(scales)
    ]


def apex_lines(scales: list[float], prefix: str = "") -> list[str]:
    return [
        f"{prefix}DLL 2026-11-30 04:32:11 - Training Iteration: {i} loss : 5.43 loss_scale : {s}"
        for i, s in enumerate(scales)
    ]


def collapsing(rng: random.Random) -> list[float]:
    scale = 2.0 ** rng.randint(7, 16)
    plateau = [scale] * rng.randint(2, 20)
    falls = [scale / 2 ** (k + 1) for k in range(rng.randint(4, 12))]
    return plateau + falls


def recovering(rng: random.Random) -> list[float]:
    scale = 2.0 ** rng.randint(7, 16)
    values = [scale] * rng.randint(1, 5)
    for _ in range(rng.randint(1, 4)):
        drops = rng.randint(1, 3)
        values += [values[-1] / 2 ** (k + 1) for k in range(drops)]
        values += [values[-1]] * rng.randint(2, 6) + [values[-1] * 2] * rng.randint(1, 4)
    return values


@pytest.mark.parametrize("seed", SEEDS)
def test_a_loss_scale_halving_to_the_end_is_non_finite(tmp_path, seed):
    rng = random.Random(seed)
    lines = rng.choice((fairseq_lines, apex_lines))(collapsing(rng), rng.choice(PREFIXES))
    verdict = triage(tmp_path, "\n".join(lines) + "\n")
    assert verdict.category == "nan_inf", verdict.summary
    assert "nan_inf.loss_scale_collapse" in kinds(verdict)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_loss_scale_that_recovers_or_calibrates_is_healthy(tmp_path, seed):
    rng = random.Random(seed)
    calibrating = [65536.0 / 2**k for k in range(rng.randint(1, 6))] + [1024.0] * rng.randint(3, 10)
    megatron = [1.0] * rng.randint(3, 30)
    scales = rng.choice((recovering(rng), calibrating, megatron))
    lines = rng.choice((fairseq_lines, apex_lines))(scales, rng.choice(PREFIXES))
    verdict = triage(tmp_path, "\n".join(lines) + "\n")
    assert "nan_inf.loss_scale_collapse" not in kinds(verdict), (scales, verdict.summary)
    assert verdict.category != "nan_inf", (scales, verdict.summary)


MASK = [
    "logits after masking:",
    "tensor([[ 0.1250,    -inf,    -inf],",
    "        [ 0.3125,  0.2500,    -inf]], device='cuda:0')",
]


def test_a_log_that_stops_on_a_tensor_holding_inf_is_non_finite_with_low_confidence(tmp_path):
    rng = random.Random(7)
    verdict = triage(tmp_path, "\n".join(healthy_steps(rng, 8) + MASK) + "\n")
    assert verdict.category == "nan_inf", verdict.summary
    assert verdict.confidence == "low"
    assert "nan_inf.nonfinite_at_stop" in kinds(verdict)


def test_the_same_tensor_in_the_middle_of_a_log_is_a_mask_not_a_failure(tmp_path):
    rng = random.Random(8)
    verdict = triage(tmp_path, "\n".join(healthy_steps(rng, 8) + MASK + healthy_steps(rng, 4)) + "\n")
    assert verdict.category != "nan_inf", verdict.summary
    assert "nan_inf.nonfinite_at_stop" not in kinds(verdict)


def test_the_values_events_take_their_place_in_reading_order(tmp_path):
    # The engine orders failures nothing else orders by their place in the logs: a NaN row read from the tail
    # goes where its line is, among the lines the rules matched, file by file.
    (tmp_path / "rank0.log").write_text("epoch,loss\n1,2.3\n2,nan\nFloatingPointError: gradients are Nan/Inf\n")
    (tmp_path / "rank1.log").write_text("3,nan\nNCCL WARN Call to ibv_reg_mr failed with error Bad address\n")
    records = read_logs(discover([str(tmp_path)], []), matcher_for())
    before = [(e.file, e.line) for e in records.events]
    read_nonfinite_values(records)
    placed = [(e.file, e.line, e.rule.id) for e in records.events]
    assert [e.order for e in records.events] == list(range(len(records.events)))
    assert [(f, line) for f, line, _ in placed] == sorted((f, line) for f, line, _ in placed)
    added = [(f, line) for f, line, rule in placed if rule == "nan_inf.nonfinite_value"]
    assert len(added) == 2 and not set(added) & set(before)


# -- signals other launchers report ---------------------------------------------------------------------


def test_mpirun_reports_which_rank_was_killed(tmp_path):
    text = (
        "step 10 loss 2.3\n"
        "--------------------------------------------------------------------------\n"
        "mpirun noticed that process rank 6 with PID 48213 on node gpu-node-004 exited on signal 9 (Killed).\n"
        "--------------------------------------------------------------------------\n"
    )
    verdict = triage(tmp_path, text)
    assert verdict.category == "host_oom"
    assert verdict.culprit_ranks == [6]


def test_mpirun_reports_a_segfault_as_a_crash_not_a_kill(tmp_path):
    text = (
        "mpirun noticed that process rank 1 with PID 4242 on node gpu-node-004 exited on signal 11 "
        "(Segmentation fault).\n"
    )
    verdict = triage(tmp_path, text)
    assert verdict.category != "host_oom"
    assert "logs.fatal_signal" in kinds(verdict)


@pytest.mark.parametrize(
    "last",
    [
        "Loading checkpoint shards:  67%|######6   | 2/3 [00:31<00:15, 15.61s/it]Killed",
        "Epoch 1:  45%|####5     | 450/1000 [01:23<01:40, 5.4it/s, loss=2.31]Killed",
        "step 1200 loss 2.31Killed",
    ],
)
def test_a_bare_killed_glued_to_a_progress_line_is_a_kill(tmp_path, last):
    verdict = triage(tmp_path, f"step 1 loss 2.3\n{last}\n")
    assert verdict.category == "host_oom", verdict.summary


def test_a_word_ending_in_killed_is_no_kill(tmp_path):
    verdict = triage(tmp_path, "step 1 loss 2.3\nworker pool: 0 respawned, 0 unkilled\nstep 2 loss 2.2\n")
    assert verdict.category != "host_oom"


# -- NCCL's connection lines where the log ends on them ------------------------------------------------


def retrying(count: int, newer: bool) -> list[str]:
    if newer:
        return [
            f"node3:7781:7840 [1] NCCL INFO ncclOsSocketPollConnect: connect to 10.2.0.14<51211> returned "
            f"Connection refused, retrying ({i}/34) after sleep for {i * 100} msec"
            for i in range(1, count + 1)
        ]
    return ["node3:7781:7840 [1] NCCL INFO Call to connect returned Connection refused, retrying"] * count


@pytest.mark.parametrize("newer", [True, False])
def test_a_log_that_ends_retrying_a_connection_is_a_transport_failure(tmp_path, newer):
    head = [
        "node3:7781:7781 [1] NCCL INFO NCCL version 2.21.5+cuda12.4",
        "node3:7781:7781 [1] NCCL INFO Bootstrap : Using eth0",
    ]
    verdict = triage(tmp_path, "\n".join(head + retrying(5, newer)) + "\n")
    assert verdict.category == "nccl_transport", verdict.summary
    assert verdict.confidence == "low"


def test_retries_before_a_communicator_completes_are_start_up_not_failure(tmp_path):
    lines = retrying(3, True) + [
        "node3:7781:7840 [1] NCCL INFO comm 0x55d1c2a0b3f0 rank 1 nranks 8 cudaDev 1 busId 1b000 - Init COMPLETE",
        *healthy_steps(random.Random(1), 5),
    ]
    verdict = triage(tmp_path, "\n".join(lines) + "\n")
    assert verdict.category != "nccl_transport", verdict.summary


def test_retries_that_exhaust_name_the_peer(tmp_path):
    line = (
        "node3:7781:7840 [1] NCCL WARN ncclOsSocketPollConnect: connect to 10.2.0.14<51211> returned "
        "No route to host, exceeded error retry count after 35 attempts"
    )
    verdict = triage(tmp_path, "\n".join(retrying(3, True) + [line]) + "\n")
    assert verdict.category == "nccl_transport"
    assert verdict.to_json()["facts"].get("address") == "10.2.0.14"


def test_the_mlx5_drivers_completion_error_and_its_cqe_dump(tmp_path):
    dump = ["mlx5: gpu-node-12: got completion with error:"] + ["00000000 00000000 00000000 00000000"] * 3
    dump.append("00000000 00008813 08000214 0000a4d2")
    verdict = triage(tmp_path, "\n".join(healthy_steps(random.Random(2), 4) + dump) + "\n")
    assert verdict.category == "nccl_transport", verdict.summary


# -- rendezvous beyond TCPStore's own messages ----------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "[E socket.cpp:610] [c10d] The network addresses of (trainer-0, 29500) cannot be retrieved "
        "(gai error: -2 - Name or service not known).",
        "RuntimeError: The client socket has failed to connect to any network address of (trainer-0, 29500). "
        "The network addresses of (trainer-0, 29500) cannot be retrieved Name or service not known.",
        "node3:7781:7781 [0] NCCL WARN Net : error encountered when getting address info : Name or service not known",
    ],
)
def test_a_host_name_that_does_not_resolve_is_rendezvous(tmp_path, line):
    verdict = triage(tmp_path, f"initializing the process group\n{line}\n")
    assert verdict.category == "rendezvous", verdict.summary


def test_gloo_connect_full_mesh_timeout_is_rendezvous(tmp_path):
    text = (
        "[rank1]: RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:152] "
        "timed out connecting: SO_ERROR: Connection refused, remote=[127.0.1.1]:33771, rank=1, size=4\n"
    )
    verdict = triage(tmp_path, text)
    assert verdict.category == "rendezvous"
    assert verdict.to_json()["facts"].get("address") == "127.0.1.1"


# -- tracebacks known by their frames and exception ------------------------------------------------------

RUNNER_TRACEBACK = """Traceback (most recent call last):
  File "/usr/local/bin/deepspeed", line 6, in <module>
    main()
  File "/usr/local/lib/python3.10/dist-packages/deepspeed/launcher/runner.py", line 470, in main
    result = subprocess.check_output(hostname_cmd)
  File "/usr/lib/python3.10/subprocess.py", line 526, in run
    raise CalledProcessError(retcode, process.args,
{exception}
"""


def test_deepspeeds_ssh_check_is_the_environment(tmp_path):
    exception = (
        "subprocess.CalledProcessError: Command '['ssh', 'worker-1', 'hostname', '-I']' returned non-zero exit "
        "status 255."
    )
    verdict = triage(tmp_path, RUNNER_TRACEBACK.format(exception=exception))
    assert verdict.category == "environment"
    assert "environment.launcher_ssh_check_failed" in kinds(verdict)


def test_another_command_failing_in_the_runner_is_not_an_ssh_failure(tmp_path):
    exception = "subprocess.CalledProcessError: Command '['pdsh', '-V']' returned non-zero exit status 1."
    verdict = triage(tmp_path, RUNNER_TRACEBACK.format(exception=exception))
    assert "environment.launcher_ssh_check_failed" not in kinds(verdict)
    assert verdict.category == "environment"  # raised by the launcher's own checks (knowledge/frames.toml)


@pytest.mark.parametrize(
    "line",
    [
        "!!!! kernel execution error. (m: 4096, n: 2048, k: 1024, error: 13)",
        "RuntimeError: cublas runtime error : the GPU program failed to execute at /opt/aten/src/THC/THCBlas.cu:368",
    ],
)
def test_cublas_execution_failures_are_gpu_faults(tmp_path, line):
    verdict = triage(tmp_path, f"step 1 loss 2.3\n{line}\n")
    assert verdict.category == "gpu_fault", verdict.summary


def test_a_cublas_allocation_failure_is_not_an_execution_failure(tmp_path):
    verdict = triage(tmp_path, "RuntimeError: cublas runtime error : resource allocation failed at THCBlas.cu:1\n")
    assert "gpu_fault.math_library_execution_failed" not in kinds(verdict)


def test_the_cli_reads_a_csv_that_went_nan(tmp_path):
    path = tmp_path / "metrics.log"
    path.write_text(csv_log(random.Random(3), 2), encoding="utf-8")
    code, verdict = triage_json(str(path))
    assert code == 1
    assert verdict["category"] == "nan_inf"


def test_a_backend_error_no_rule_knows_is_the_transport(tmp_path):
    text = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 10, in <module>\n'
        "    model = build()\n"
        "torch.distributed.DistBackendError: the communicator could not be created (an error of a newer release)\n"
    )
    verdict = triage(tmp_path, text)
    assert verdict.category == "nccl_transport", verdict.summary


def test_every_pattern_that_reads_a_line_runs_in_linear_time():
    # A log comes from the job: a crafted 16 KB line of spaces or digits must not make a backtracking engine
    # take minutes (docs/security.md), so every pattern of the reading is an RE2 one.
    import torchtriage.analysis.nonfinite_values as module

    patterns = {name: value for name, value in vars(module).items() if hasattr(value, "search")}
    assert len(patterns) >= 8
    assert [name for name, pattern in patterns.items() if not is_linear(pattern)] == []
    assert reading_of("nan," * 4_000 + "1") is not None and reading_of(" " * 16_000 + "1" * 16_000 + "x") is None
