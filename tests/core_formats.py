"""What the programs print, for the generated logs of the core categories (tests/core_logs.py).

Where tests/long_tail_formats.py covers the six classes of the long tail, this file covers the core categories
(oom, host_oom, gpu_fault, nan_inf, nccl_timeout, nccl_transport, rendezvous, environment, usage, hang, deepep) as
the programs print them across the releases where their wording changed (`ERAS`: torch 1.9 to 2.6 and the NCCL each
shipped with), inside the output of one made-up job (`Job`): several ranks on several nodes, under one launcher
(torchrun, srun, DeepSpeed's launcher, Ray, mpirun), with the ordinary output of training before the failure
(tests/long_tail_formats.py `Steps` and its start-up lines) and healthy lines that hold the words of failures
(DeepSpeed's loss-scale warm-up, c10d's errno 99 warning, DDP's find_unused_parameters warning). One rank's failure
is followed by what its peers and the launcher print: NCCL watchdog timeouts, transport errors, the launcher's
report.

Each writer's docstring names the repository and path of the format string it follows; where the program is closed
source (the TPU runtime, nvidia-smi), it names public issues that show the lines verbatim. Each writer returns its
truth: a category and, where the real mechanism is ambiguous, every honest answer (`Failure.accept`), the docstring
saying why. The writers are listed in `WRITERS`, each with its category and the phase of a job it fails in.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from long_tail_formats import (
    _KERNEL_PRINTF,
    AGENT,
    LAUNCHER,
    RANK,
    Steps,
    Values,
    _look_alikes,
    _nccl_startup,
    _omp_warning,
    _python_warning,
)

# --- Lines and jobs -----------------------------------------------------------------------------------------

# Who printed a line (tests/long_tail_formats.py RANK, AGENT, LAUNCHER), and the kernel: dmesg, journalctl.
KERNEL = "kernel"

# torch releases whose printed formats differ (the OOM message, the watchdog's, the log headers, torchrun's).
ERAS = ("1.9", "1.12", "2.0", "2.1", "2.3", "2.4", "2.6")


# The NCCL each release shipped with (its wheels' nvidia-nccl-cu* pins), for the versions printed beside it.
NCCL_OF_ERA = {
    "1.9": ("2.7.8",),
    "1.12": ("2.10.3",),
    "2.0": ("2.14.3",),
    "2.1": ("2.18.1",),
    "2.3": ("2.20.5",),
    "2.4": ("2.20.5",),
    "2.6": ("2.21.5", "2.26.2", "2.27.3"),
}


def at_least(era: str, version: str) -> bool:
    return tuple(int(x) for x in era.split(".")) >= tuple(int(x) for x in version.split("."))


@dataclass
class L:
    """One line, who printed it (a rank, a node's agent, the job's launcher, the kernel) and when."""

    text: str
    kind: str = RANK
    rank: int | None = None
    node: int | None = None
    time: datetime | None = None


@dataclass
class Failure:
    writer: str
    lines: list[L]
    truth: str
    accept: frozenset[str] = frozenset()
    note: str = ""
    # The ranks a verdict may name, where the writer knows better than its Writer's `names_culprit`: an empty set
    # makes no claim (the lines number nodes, not ranks).
    culprits: frozenset[int] | None = None


class Job:
    """One made-up job: its torch release, launcher, nodes, ranks, hosts and pids, and a culprit rank."""

    LAUNCHERS = ("torchrun", "torchrun", "torchrun", "srun", "deepspeed", "ray", "mpirun")

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.v = Values(rng)
        v = self.v
        self.era = rng.choice(ERAS)
        self.nodes = rng.choice((1, 1, 2, 2, 4, 8))
        self.per_node = rng.choice((8, 8, 8, 4))
        self.world = self.nodes * self.per_node
        self.launcher = rng.choice(self.LAUNCHERS)
        if self.launcher == "torchrun":
            choices = ["none", "default"] + (["rank", "rank", "rank"] if at_least(self.era, "2.2") else [])
            self.prefix = rng.choice(choices)
        else:
            self.prefix = self.launcher
        self.timestamps = rng.random() < 0.15  # kubectl logs --timestamps: RFC 3339 before every line
        base = rng.choice(("gpu-node-{:03d}", "dgx-a100-{:02d}", "h100-{:02d}", "node{}", "ip-10-42-{}-17"))
        first = rng.randint(0, 60)
        self.hosts = [base.format(first + n) for n in range(self.nodes)]
        self.ips = [self.ip() for _ in range(self.nodes)]
        self.pids = [rng.randint(1_000, 4_000_000) for _ in range(self.world)]
        self.agent_pids = [rng.randint(1_000, 4_000_000) for _ in range(self.nodes)]
        self.culprit = rng.randrange(self.world)
        # The culprit's values in `v`, so the long tail's helpers print its host and pid.
        v.world, v.rank = self.world, self.culprit
        v.local_rank = v.cuda_dev = self.culprit % self.per_node
        v.node, v.host, v.pid = (
            self.node_of(self.culprit),
            self.hosts[self.node_of(self.culprit)],
            self.pids[self.culprit],
        )
        self.style = rng.choice(Steps.STYLES)
        self.steps = Steps(v, self.style)
        self.job_id = rng.randint(10_000, 9_999_999)
        self.pci_bus = rng.choice(("18", "2a", "3a", "3b", "5d", "9a", "ab", "ba", "db"))
        v.nccl_version = rng.choice(NCCL_OF_ERA[self.era])
        self.timeout_ms = rng.choice((600000, 1800000, 300000, 7200000, 120000))
        self.dist_timeout_s = rng.choice((600, 900, 1800))

    def ip(self) -> str:
        a = self.rng.choice(("10.{}.{}.{}", "192.168.{}.{}", "172.16.{}.{}"))
        return a.format(*(self.rng.randint(1, 254) for _ in range(a.count("{}"))))

    # where ranks are
    def node_of(self, rank: int) -> int:
        return rank // self.per_node

    def local(self, rank: int) -> int:
        return rank % self.per_node

    def peers(self, count: int, exclude: set[int] | None = None) -> list[int]:
        pool = [r for r in range(self.world) if r not in (exclude or {self.culprit})]
        return sorted(self.rng.sample(pool, min(count, len(pool))))

    def remote_peers(self, count: int) -> list[int]:
        node = self.node_of(self.culprit)
        pool = [r for r in range(self.world) if self.node_of(r) != node]
        return sorted(self.rng.sample(pool, min(count, len(pool)))) if pool else self.peers(count)

    # clocks and headers
    def tick(self, low: float = 0.01, high: float = 2.0) -> datetime:
        return self.v.tick(low, high)

    def glog(self, severity: str, source: str, line: int | None = None) -> str:
        """c10's log header: `[E ProcessGroupNCCL.cpp:455] ` before 2.4, glog's `[E1130 02:54:48.068043558
        ProcessGroupNCCL.cpp:1515] ` from 2.4 (torch/csrc/distributed/c10d, c10/util/Logging.cpp)."""
        t = self.tick()
        line = line or self.rng.randint(300, 2300)
        if at_least(self.era, "2.4"):
            return f"[{severity}{t:%m%d %H:%M:%S}.{self.rng.randrange(10**9):09d} {source}:{line}] "
        return f"[{severity} {source}:{line}] "

    def agent_log(self, level: str, module: str, message: str, node: int) -> L:
        """torchrun's agent logging (torch/distributed/elastic/utils/logging.py): `LEVEL:module:msg` up to 1.13,
        `[date] module: [LEVEL] msg` in 2.0-2.3, torch's own `E0301 12:00:00.123000 pid path:line] msg` from 2.4."""
        t = self.tick()
        if not at_least(self.era, "2.0"):
            text = f"{level}:{module}:{message}"
        elif not at_least(self.era, "2.4"):
            text = f"[{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d}] {module}: [{level}] {message}"
        else:
            path = module.replace(".", "/") + ".py"
            text = (
                f"{level[0]}{t:%m%d %H:%M:%S}.{t.microsecond:06d} {self.agent_pids[node]} "
                f"{path}:{self.rng.randint(100, 999)}] {message}"
            )
        return L(text, AGENT, node=node, time=t)

    def nccl(self, rank: int, level: str, message: str, source: str | None = None) -> str:
        """NCCL's debug line (NVIDIA/nccl src/debug.cc ncclDebugLog): `host:pid:tid [dev] NCCL INFO msg`, WARN
        with the file and line first."""
        where = f"{source}:{self.rng.randint(40, 2400)} " if source else ""
        pid = self.pids[rank]
        return (
            f"{self.hosts[self.node_of(rank)]}:{pid}:{pid + self.rng.randint(1, 900)} [{self.local(rank)}] "
            f"{where}NCCL {level} {message}"
        )

    def frame(self, path: str, function: str, code: str) -> list[str]:
        return self.v.frame(path, function, code)

    def tp(self, module: str) -> str:
        return self.v.torch_path(module)

    @property
    def site(self) -> str:
        return self.v.site

    def pg_prefix(self, rank: int) -> str:
        """ProcessGroupNCCL::logPrefix: `[PG 0 Rank 3] ` (2.2-2.3), `[PG 0 (default_pg) Rank 3] ` (2.4-2.5),
        `[PG ID 0 PG GUID 0(default_pg) Rank 3] ` (2.6+); none before 2.2."""
        if at_least(self.era, "2.6"):
            return f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}] "
        if at_least(self.era, "2.4"):
            return f"[PG 0 (default_pg) Rank {rank}] "
        if at_least(self.era, "2.2"):
            return f"[PG 0 Rank {rank}] "
        return ""


def R(job: Job, rank: int, texts: list[str] | str) -> list[L]:
    texts = [texts] if isinstance(texts, str) else texts
    return [L(t, RANK, rank=rank, node=job.node_of(rank)) for t in texts]


# --- Sizes --------------------------------------------------------------------------------------------------


def fmt_size(n: float) -> str:
    """c10/util (format_size in c10/cuda/CUDACachingAllocator.cpp): bytes, KiB, MiB, GiB with two decimals."""
    if n <= 1024:
        return f"{int(n)} bytes"
    if n <= 1048576:
        return f"{n / 1024:.2f} KiB"
    if n <= 1073741824:
        return f"{n / 1048576:.2f} MiB"
    return f"{n / 1073741824:.2f} GiB"


GIB = 1 << 30

# --- Ordinary output, healthy look-alikes ---------------------------------------------------------------------


def benign_noise(job: Job) -> list[L]:
    """Healthy lines that hold failure words: c10d's errno 99 warning on hosts without IPv6 (torch 2.0-2.2
    torch/csrc/distributed/c10d/socket.cpp: "[W socket.cpp:601] [c10d] The client socket has failed to connect to
    [localhost]:29500 (errno: 99 - Cannot assign requested address)."), DDP's find_unused_parameters warning
    (torch/csrc/distributed/c10d/reducer.cpp: "find_unused_parameters=True was specified in DDP constructor, but did
    not find any unused parameters in the forward pass. ..."), DeepSpeed's loss-scale warm-up
    (deepspeed/runtime/fp16/loss_scaler.py DynamicLossScaler.update_scale: "[deepspeed] OVERFLOW! Rank 0 Skipping
    step. Attempted loss scale: 65536, reducing to 32768")."""
    rng, out = job.rng, []
    r = rng.randrange(job.world)
    if job.launcher == "torchrun" and job.era in ("2.0", "2.1") and rng.random() < 0.4:
        host = rng.choice(("localhost", job.hosts[0]))
        for _ in range(rng.randint(1, 3)):
            out += R(
                job,
                r,
                f"[W socket.cpp:{rng.choice((426, 558, 601, 663))}] [c10d] The client socket has failed "
                f"to connect to [{host}]:29500 (errno: 99 - Cannot assign requested address).",
            )
    if rng.random() < 0.25:
        head = "[W reducer.cpp:1346] Warning: " if not at_least(job.era, "2.4") else job.glog("W", "reducer.cpp", 1402)
        if at_least(job.era, "2.4"):
            head += "Warning: "
        out += R(
            job,
            r,
            head + "find_unused_parameters=True was specified in DDP constructor, but did not find any "
            "unused parameters in the forward pass. This flag results in an extra traversal of the autograd "
            "graph every iteration,  which can adversely affect performance. If your model indeed never has "
            "any unused parameters in the forward pass, consider turning this flag off. Note that this warning "
            "may be a false positive if your model has flow control causing later iterations to have unused "
            "parameters. (function operator())",
        )
    if job.launcher == "deepspeed" and rng.random() < 0.6:
        scale = 2 ** rng.choice((16, 32))
        for _ in range(rng.randint(1, 5)):
            t = job.tick()
            out.append(
                L(
                    f"[{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d}] [INFO] [loss_scaler.py:183:update_scale] "
                    f"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {scale}, reducing to "
                    f"{scale // 2}",
                    RANK,
                    rank=0,
                    node=0,
                )
            )
            scale //= 2
    return out


def launcher_start(job: Job) -> list[L]:
    """What the launcher prints first: DeepSpeed's launch.py (deepspeed/launcher/launch.py main: "WORLD INFO DICT:",
    "nnodes=%d, num_local_procs=%d, node_rank=%d", "dist_world_size=%d", "Setting CUDA_VISIBLE_DEVICES=%s"), Ray's
    worker start, torchrun's OMP warning (torch/distributed/run.py)."""
    out: list[L] = []
    if job.launcher == "deepspeed":
        for node in range(job.nodes):

            def ds(msg: str, node: int = node) -> L:
                t = job.tick()
                return L(
                    f"[{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d}] [INFO] "
                    f"[launch.py:{job.rng.randint(130, 170)}:main] {msg}",
                    AGENT,
                    node=node,
                )

            hosts = {h: list(range(job.per_node)) for h in job.hosts}
            out += [
                ds(f"WORLD INFO DICT: {hosts}"),
                ds(f"nnodes={job.nodes}, num_local_procs={job.per_node}, node_rank={node}"),
                ds(f"dist_world_size={job.world}"),
                ds("Setting CUDA_VISIBLE_DEVICES=" + ",".join(str(i) for i in range(job.per_node))),
            ]
    elif job.launcher == "torchrun" and job.rng.random() < 0.6:
        out += [L(line.text, AGENT, node=0) for line in _omp_warning(job.v)]
    return out


def preamble(job: Job, phase: str = "training") -> list[L]:
    """The job's ordinary output up to a failure of `phase`: the launcher's start, warnings, NCCL's start-up lines
    (the culprit's), healthy look-alikes, rank 0's step lines (tests/long_tail_formats.py Steps)."""
    rng, v = job.rng, job.v
    out = launcher_start(job)
    if phase == "launch":
        return out
    if rng.random() < 0.4:
        out += [L(x.text, RANK, rank=job.culprit, node=job.node_of(job.culprit)) for x in _python_warning(v)]
    if phase == "startup":
        return out
    if rng.random() < 0.6:
        out += [L(x.text, RANK, rank=job.culprit, node=job.node_of(job.culprit)) for x in _nccl_startup(v)]
    if phase == "init":
        return out
    out += [L(x.text, RANK, rank=0, node=0) for x in _look_alikes(v)]
    out += benign_noise(job)
    out += [L(x.text, RANK, rank=0, node=0) for x in job.steps.lines(rng.randint(3, 20))]
    return out


# --- Frames of the frameworks around the failure ---------------------------------------------------------------


def training_frames(job: Job, where: str = "backward") -> list[str]:
    """The call path to the failing op by the job's style: Hugging Face's Trainer and accelerate
    (transformers/trainer.py train -> _inner_training_loop -> training_step; accelerate/accelerator.py backward),
    Lightning (lightning/pytorch/trainer/trainer.py fit -> call._call_and_handle_interrupt), Megatron
    (megatron/training/training.py pretrain -> train -> train_step; megatron/core/pipeline_parallel/schedules.py),
    DeepSpeed (deepspeed/runtime/engine.py backward), fairseq (fairseq_cli/train.py), a plain loop."""
    s, f = job.site, job.frame
    out: list[str] = []
    if job.style == "hf":
        out += f("/workspace/train.py", "<module>", "trainer.train()")
        out += f(f"{s}/transformers/trainer.py", "train", "return inner_training_loop(")
        out += f(
            f"{s}/transformers/trainer.py", "_inner_training_loop", "tr_loss_step = self.training_step(model, inputs)"
        )
        if where == "backward":
            out += f(f"{s}/transformers/trainer.py", "training_step", "self.accelerator.backward(loss, **kwargs)")
            out += f(f"{s}/accelerate/accelerator.py", "backward", "loss.backward(**kwargs)")
        else:
            out += f(f"{s}/transformers/trainer.py", "training_step", "loss = self.compute_loss(model, inputs)")
            out += f(f"{s}/transformers/trainer.py", "compute_loss", "outputs = model(**inputs)")
    elif job.style == "lightning":
        out += f("/workspace/train.py", "<module>", "trainer.fit(model, datamodule=dm)")
        out += f(f"{s}/lightning/pytorch/trainer/trainer.py", "fit", "call._call_and_handle_interrupt(")
        out += f(
            f"{s}/lightning/pytorch/trainer/call.py",
            "_call_and_handle_interrupt",
            "return trainer.strategy.launcher.launch(trainer_fn, *args, trainer=trainer, **kwargs)",
        )
        out += f(f"{s}/lightning/pytorch/loops/optimization/automatic.py", "run", "closure()")
        if where == "backward":
            out += f(f"{s}/lightning/pytorch/core/module.py", "backward", "loss.backward(*args, **kwargs)")
        else:
            out += f(f"{s}/lightning/pytorch/strategies/ddp.py", "training_step", "return self.model(*args, **kwargs)")
    elif job.style == "megatron":
        out += f("/workspace/Megatron-LM/pretrain_gpt.py", "<module>", "pretrain(")
        out += f(
            "/workspace/Megatron-LM/megatron/training/training.py",
            "pretrain",
            "iteration, num_floating_point_operations_so_far = train(",
        )
        out += f("/workspace/Megatron-LM/megatron/training/training.py", "train", "train_step(forward_step_func,")
        out += f(
            "/workspace/Megatron-LM/megatron/training/training.py",
            "train_step",
            "losses_reduced = forward_backward_func(",
        )
        if where == "backward":
            out += f(
                "/workspace/Megatron-LM/megatron/core/pipeline_parallel/schedules.py",
                "backward_step",
                "custom_backward(output_tensor[0], output_tensor_grad[0])",
            )
        else:
            out += f(
                "/workspace/Megatron-LM/megatron/core/pipeline_parallel/schedules.py",
                "forward_step",
                "output_tensor, loss_func = forward_step_func(data_iterator, model)",
            )
    elif job.style == "fairseq":
        out += f(
            f"{s}/fairseq_cli/train.py", "main", "valid_losses, should_stop = train(cfg, trainer, task, epoch_itr)"
        )
        out += f(f"{s}/fairseq/trainer.py", "train_step", "loss, sample_size_i, logging_output = self.task.train_step(")
        out += f(
            f"{s}/fairseq/tasks/fairseq_task.py",
            "train_step",
            "optimizer.backward(loss)"
            if where == "backward"
            else "loss, sample_size, logging_output = criterion(model, sample)",
        )
    elif job.launcher == "deepspeed":
        out += f("/workspace/train.py", "<module>", "main()")
        if where == "backward":
            out += f("/workspace/train.py", "main", "model_engine.backward(loss)")
            out += f(f"{s}/deepspeed/utils/nvtx.py", "wrapped_fn", "ret_val = func(*args, **kwargs)")
            out += f(
                f"{s}/deepspeed/runtime/engine.py",
                "backward",
                "self.optimizer.backward(loss, retain_graph=retain_graph)",
            )
        else:
            out += f("/workspace/train.py", "main", "loss = model_engine(batch)")
            out += f(f"{s}/deepspeed/runtime/engine.py", "forward", "loss = self.module(*inputs, **kwargs)")
    else:
        out += f("/workspace/train.py", "<module>", "main()")
        out += f(
            "/workspace/train.py", "main", "loss.backward()" if where == "backward" else "logits = model(input_ids)"
        )
    if where == "backward":
        out += f(job.tp("_tensor.py"), "backward", "torch.autograd.backward(")
        out += f(
            job.tp("autograd/__init__.py"),
            "backward",
            "_engine_run_backward("
            if at_least(job.era, "2.3")
            else "Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass",
        )
    else:
        out += f(job.tp("nn/modules/module.py"), "_call_impl", "return forward_call(*args, **kwargs)")
    return out


def traceback(
    job: Job, rank: int, last: list[str], where: str = "backward", frames: list[str] | None = None
) -> list[L]:
    body = (
        ["Traceback (most recent call last):"] + (frames if frames is not None else training_frames(job, where)) + last
    )
    return R(job, rank, body)


def cuda_error_lines(job: Job, error: str, code: str | None, exception: str = "RuntimeError") -> list[str]:
    """c10/cuda/CUDAException.cpp c10_cuda_check_implementation: "CUDA error: " + cudaGetErrorString, the
    search help (2.5+), the asynchronous note, CUDA_LAUNCH_BLOCKING, TORCH_USE_CUDA_DSA (2.1+)."""
    lines = [f"{exception}: CUDA error: {error}"]
    if code and at_least(job.era, "2.6") and job.rng.random() < 0.6:
        lines.append(
            f"Search for `{code}' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html "
            "for more information."
        )
    lines += [
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
        "might be incorrect.",
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1.",
    ]
    if at_least(job.era, "2.1"):
        lines.append("Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
    return lines


# --- Endings: launchers' reports ------------------------------------------------------------------------------


def child_failed(job: Job, failed: list[tuple[int, int]]) -> list[L]:
    """torchrun's report (torch/distributed/elastic/multiprocessing/api.py: "failed (exitcode: %d) local_rank: %d
    (pid: %d) of binary: %s"; errors/__init__.py ChildFailedError.format_msg: the Failures / Root Cause table,
    "Signal %d (%s) received by PID %d" for a signal, else the errors.html link), on the first failed rank's node;
    the agent first sends SIGTERM to its other workers ("Sending process %s closing signal %s")."""
    rng = job.rng
    first_rank, code = failed[0]
    node = job.node_of(first_rank)
    out: list[L] = []
    mod = "torch.distributed.elastic.multiprocessing.api"
    for r in range(node * job.per_node, (node + 1) * job.per_node):
        if r not in dict(failed) and rng.random() < 0.7:
            out.append(job.agent_log("WARNING", mod, f"Sending process {job.pids[r]} closing signal SIGTERM", node))
    out.append(
        job.agent_log(
            "ERROR",
            mod,
            f"failed (exitcode: {code}) local_rank: {job.local(first_rank)} (pid: "
            f"{job.pids[first_rank]}) of binary: /usr/bin/python3",
            node,
        )
    )
    body = ["Traceback (most recent call last):"]
    body += job.frame("/usr/local/bin/torchrun", "<module>", "sys.exit(main())")
    body += job.frame(
        job.tp("distributed/elastic/multiprocessing/errors/__init__.py"), "wrapper", "return f(*args, **kwargs)"
    )
    body += job.frame(job.tp("distributed/launcher/api.py"), "launch_agent", "raise ChildFailedError(")
    sig = {
        -9: "Signal 9 (SIGKILL) received by PID {}",
        -6: "Signal 6 (SIGABRT) received by PID {}",
        -15: "Signal 15 (SIGTERM) received by PID {}",
    }

    def entry(i: int, rank: int, c: int) -> list[str]:
        t = job.v.clock
        return [
            f"[{i}]:",
            f"  time      : {t:%Y-%m-%d_%H:%M:%S}",
            f"  host      : {job.hosts[job.node_of(rank)]}",
            f"  rank      : {rank} (local_rank: {job.local(rank)})",
            f"  exitcode  : {c} (pid: {job.pids[rank]})",
            "  error_file: <N/A>",
            "  traceback : "
            + (
                sig[c].format(job.pids[rank])
                if c in sig
                else "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
            ),
        ]

    others = [x for x in failed[1:] if job.node_of(x[0]) == node]
    body += [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "=" * 60,
        "train.py FAILED",
        "-" * 60,
        "Failures:",
    ]
    if others:
        for i, (r, c) in enumerate(others, 1):
            body += entry(i, r, c)
    else:
        body.append("  <NO_OTHER_FAILURES>")
    body += ["-" * 60, "Root Cause (first observed failure):"] + entry(0, first_rank, code) + ["=" * 60]
    return out + [L(t, AGENT, node=node) for t in body]


def srun_end(job: Job, rank: int, how: str) -> list[L]:
    """srun's own lines (slurm src/srun/srun_job.c, src/common/... ): "srun: error: %s: task %s: %s" (Exited with
    exit code %d, Killed, Out Of Memory, Aborted), "srun: Terminating StepId=%u.%u" (--kill-on-bad-exit), slurmstepd's
    "*** STEP %u.%u ON %s CANCELLED AT %s ***", then the other tasks' "Terminated"."""
    host = job.hosts[job.node_of(rank)]
    step = f"{job.job_id}.0"
    out = [L(f"srun: error: {host}: task {rank}: {how}", LAUNCHER)]
    if job.rng.random() < 0.6:
        t = job.tick()
        out += [
            L(f"srun: Terminating StepId={step}", LAUNCHER),
            L(f"slurmstepd: error: *** STEP {step} ON {host} CANCELLED AT {t:%Y-%m-%dT%H:%M:%S} ***", LAUNCHER),
        ]
        if job.world > 1:
            others = [x for x in range(job.world) if x != rank]
            runs, start = [], others[0]
            for a, b in zip(others, others[1:] + [None], strict=True):
                if b != a + 1:
                    runs.append(str(start) if start == a else f"{start}-{a}")
                    start = b
            out.append(L(f"srun: error: {host}: tasks {','.join(runs)}: Terminated", LAUNCHER))
        out.append(L(f"srun: Force Terminated StepId={step}", LAUNCHER))
    return out


def deepspeed_end(job: Job, rank: int, code: int) -> list[L]:
    """deepspeed/launcher/launch.py sigkill_handler: logger.info(f"Killing subprocess {pid}"), then
    logger.error(f"{cmd} exits with return code = {returncode}")."""
    node = job.node_of(rank)
    out = []
    for r in range(node * job.per_node, (node + 1) * job.per_node):
        t = job.tick(0, 0.01)
        out.append(
            L(
                f"[{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d}] [INFO] "
                f"[launch.py:{job.rng.choice((315, 316, 325))}:sigkill_handler] Killing subprocess {job.pids[r]}",
                AGENT,
                node=node,
            )
        )
    t = job.tick(0, 0.01)
    cmd = (
        f"['/usr/bin/python3', '-u', 'train.py', '--local_rank={job.local(rank)}', '--deepspeed', "
        "'--deepspeed_config', 'ds_config.json']"
    )
    out.append(
        L(
            f"[{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d}] [ERROR] "
            f"[launch.py:{job.rng.choice((321, 322, 331))}:sigkill_handler] {cmd} exits with return code = {code}",
            AGENT,
            node=node,
        )
    )
    return out


def kills_everyone(job: Job) -> bool:
    """srun (--kill-on-bad-exit) and mpirun end every task as soon as one fails: no peer outlives the first."""
    return job.launcher in ("srun", "mpirun")


def cascade(
    job: Job,
    culprit_code: int,
    peer_lines: Callable[[list[int]], list[L]],
    peers: list[int],
    peer_code: int,
    delay_ms: int,
) -> list[L]:
    """After the culprit's own lines: under torchrun, DeepSpeed or Ray the culprit's node agent reports at once and the
    peers on other nodes meet it `delay_ms` later (their own agents report them); under srun or mpirun the launcher ends
    every task at once, so the peers print nothing (the launcher's report alone)."""
    if kills_everyone(job) or not peers:
        return launcher_end(job, [(job.culprit, culprit_code)])
    out = launcher_end(job, [(job.culprit, culprit_code)])
    job.v.clock += timedelta(milliseconds=delay_ms)
    out += peer_lines(peers)
    if job.rng.random() < 0.5:
        out += launcher_end(job, [(peers[0], peer_code)])
    return out


def launcher_end(job: Job, failed: list[tuple[int, int]]) -> list[L]:
    """The launcher's report of the ranks that ended (rank, exit code: negative a signal), where it prints one."""
    if not failed or job.rng.random() < 0.2:
        return []
    rank, code = failed[0]
    if job.launcher == "torchrun":
        return child_failed(job, failed)
    if job.launcher == "srun":
        how = {-9: "Killed", -6: "Aborted"}.get(code, f"Exited with exit code {code}")
        return srun_end(job, rank, how)
    if job.launcher == "deepspeed":
        return deepspeed_end(job, rank, code)
    if job.launcher == "mpirun":
        dashes = "-" * 74
        if code < 0:
            text = [
                dashes,
                f"mpirun noticed that process rank {rank} with PID {job.pids[rank]} on node "
                f"{job.hosts[job.node_of(rank)]} exited on signal {-code} "
                f"({ {9: 'Killed', 6: 'Aborted'}.get(-code, 'Terminated') }).",
                dashes,
            ]
        else:
            text = [
                dashes,
                "Primary job  terminated normally, but 1 process returned",
                "a non-zero exit code. Per user-direction, the job has been aborted.",
                dashes,
                dashes,
                "mpirun detected that one or more processes exited with non-zero status, thus causing",
                "the job to be terminated. The first process to do so was:",
                "",
                f"  Process name: [[{job.rng.randint(1000, 65000)},1],{rank}]",
                f"  Exit code:    {code}",
                dashes,
            ]
        return [L(t, LAUNCHER) for t in text]
    return []


# --- Era-dependent messages -----------------------------------------------------------------------------------


def oom_message(job: Job, device: int, vendor: str = "CUDA") -> str:
    """The caching allocator's message (pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator::
    malloc): up to 2.0 "CUDA out of memory. Tried to allocate X (GPU N; T total capacity; A already allocated; F free;
    [L allowed; ]R reserved in total by PyTorch)" (+ the max_split_size_mb hint from 1.10); 2.1 "Tried to allocate X.
    GPU N has a total capacty of T of which F is free. [Process P has M memory in use. ]Of the allocated memory A is
    allocated by PyTorch, and B is reserved by PyTorch but unallocated. If reserved but unallocated memory is large
    try setting max_split_size_mb ..."; 2.2+ "capacity", "Including non-PyTorch memory, this process has M memory in
    use. ", the expandable_segments hint; 2.5+ "with X allocated in private pools (e.g., CUDA Graphs), ". ROCm
    builds print HIP (hipified source). The exception: RuntimeError (<1.13), torch.cuda.OutOfMemoryError (1.13-2.4),
    torch.OutOfMemoryError (2.5+)."""
    rng = job.rng
    total = rng.choice((15.78, 23.65, 31.74, 39.39, 44.35, 79.11, 79.15, 93.0, 139.72, 191.98)) * GIB
    alloc = (
        rng.choice((20, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 30720)) * 1048576 * rng.choice((1, 1, 1.5))
    )
    allocated = total * rng.uniform(0.6, 0.97)
    reserved = allocated + rng.uniform(0.001, 0.05) * total
    free = max(total - reserved - rng.uniform(0.2, 1.5) * GIB, rng.uniform(1, 900) * 1048576)
    if not at_least(job.era, "2.1"):
        allowed = f"{fmt_size(total * 0.9)} allowed; " if rng.random() < 0.1 else ""
        msg = (
            f"{vendor} out of memory. Tried to allocate {fmt_size(alloc)} (GPU {device}; {fmt_size(total)} total "
            "capacity; "
            f"{fmt_size(allocated)} already allocated; {fmt_size(free)} free; {allowed}{fmt_size(reserved)} reserved "
            "in "
            "total by PyTorch)"
        )
        if at_least(job.era, "1.12"):
            msg += (
                " If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  "
                "See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
            )
        return msg
    cap = "capacty" if job.era == "2.1" else "capacity"
    proc = ""
    if job.era == "2.1" or rng.random() < 0.3:
        proc += (
            f"Process {job.pids[job.culprit] if rng.random() < 0.5 else rng.randint(1000, 4000000)} has "
            f"{fmt_size(reserved + 0.5 * GIB)} memory in use. "
        )
    if at_least(job.era, "2.2"):
        proc += (
            f"Including non-PyTorch memory, this process has {fmt_size(reserved + rng.uniform(0.3, 1.2) * GIB)} "
            "memory in use. "
        )
    pools = ""
    if at_least(job.era, "2.5") and rng.random() < 0.2:
        pools = f"with {fmt_size(rng.uniform(0.1, 4) * GIB)} allocated in private pools (e.g., CUDA Graphs), "
    msg = (
        f"{vendor} out of memory. Tried to allocate {fmt_size(alloc)}. GPU {device} has a total {cap} of "
        f"{fmt_size(total)} of "
        f"which {fmt_size(free)} is free. {proc}Of the allocated memory {fmt_size(allocated)} is allocated by PyTorch, "
        f"{pools}and {fmt_size(reserved - allocated)} is reserved by PyTorch but unallocated."
    )
    if job.era == "2.1":
        msg += (
            " If reserved but unallocated memory is large try setting max_split_size_mb to avoid fragmentation.  See "
            "documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
        )
    else:
        msg += (
            " If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
            "to avoid fragmentation.  See documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
        )
    return msg


def oom_exception(job: Job) -> str:
    if at_least(job.era, "2.6"):
        return "torch.OutOfMemoryError"
    if at_least(job.era, "1.12") and job.era != "1.12":
        return "torch.cuda.OutOfMemoryError"
    return "RuntimeError"


def rank_numel(op: str, first: int | None, drawn: int) -> int:
    """One rank's NumelIn: the first rank's for an op whose size every rank shares; its own (`drawn`) for an
    all_to_all (each rank sends its own split) or a coalesced op (each rank batched its own)."""
    return drawn if first is None or op.startswith("ALLTOALL") or op == "COALESCED" else first


OPS = (
    "ALLREDUCE",
    "_ALLGATHER_BASE",
    "_REDUCE_SCATTER_BASE",
    "BROADCAST",
    "ALLGATHER",
    "REDUCE_SCATTER",
    "ALLTOALL_BASE",
    "COALESCED",
)


def work_nccl(job: Job, seq: int, op: str, numel: int) -> str:
    """WorkNCCL's operator<< (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp): "WorkNCCL(OpType=%s, TensorShape=[..],
    Timeout(ms)=%d)" in 1.8-1.9, "WorkNCCL(SeqNum=%d, OpType=%s, Timeout(ms)=%d)" in 1.10-1.13, with "NumelIn=%d,
    NumelOut=%d, " from 2.0."""
    if job.era == "1.9":
        return f"WorkNCCL(OpType={op}, TensorShape=[{numel}], Timeout(ms)={job.timeout_ms})"
    if job.era == "1.12":
        return f"WorkNCCL(SeqNum={seq}, OpType={op}, Timeout(ms)={job.timeout_ms})"
    return (
        f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, "
        f"NumelOut={numel * (job.world if 'GATHER' in op else 1)}, Timeout(ms)={job.timeout_ms})"
    )


def watchdog_timeout(job: Job, rank: int, seq: int, op: str, numel: int, full: bool = True) -> list[L]:
    """ProcessGroupNCCL's watchdog on a timeout (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp WorkNCCL::checkTimeout
    "[Rank %d] Watchdog caught collective operation timeout: %s ran for %d milliseconds before timing out.";
    workCleanupLoop/watchdogHandler: "Exception (either an error or timeout) detected by watchdog at work: %d, last
    enqueued NCCL work: %d, last completed NCCL work: %d." (2.4-2.5), "failure detected by watchdog at work sequence id:
    %d PG status: last enqueued work: %d, last completed work: %d" (2.6+), "Timeout at NCCL work: ..." (2.2-2.5);
    WorkNCCL::handleException "Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA
    kernels, subsequent GPU operations might run on corrupted/incomplete data." and "To avoid data inconsistency, we
    are taking the entire process down."; ncclCommWatchdog "Process group watchdog thread terminated with exception: "
    (2.2+; "NCCL watchdog thread terminated with exception: " in 2.0-2.1), then std::terminate's report)."""
    rng = job.rng
    work = work_nccl(job, seq, op, numel)
    ran = job.timeout_ms + rng.randint(1, 900)
    head = (
        f"[Rank {rank}] Watchdog caught collective operation timeout: {work} ran for {ran} milliseconds before "
        "timing out."
    )
    pg = job.pg_prefix(rank)
    if at_least(job.era, "2.6"):
        head = f"{pg}Watchdog caught collective operation timeout: {work} ran for {ran} milliseconds before timing out."
    lines = [job.glog("E", "ProcessGroupNCCL.cpp") + head]
    if not full:
        return R(job, rank, lines)
    last_done = seq - 1
    if at_least(job.era, "2.6"):
        lines.append(
            job.glog("E", "ProcessGroupNCCL.cpp") + f"{pg} failure detected by watchdog at work sequence id: {seq} "
            f"PG status: last enqueued work: {seq + rng.choice((0, 0, 1, 2))}, last completed work: {last_done}"
        )
        lines.append(
            job.glog("E", "ProcessGroupNCCL.cpp") + f"{pg}Stack trace of the failed collective not found, "
            "potentially because FlightRecorder is disabled. You can enable it by setting "
            "TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value."
        )
    elif at_least(job.era, "2.4"):
        lines.append(
            job.glog("E", "ProcessGroupNCCL.cpp") + f"{pg}Exception (either an error or timeout) detected by "
            f"watchdog at work: {seq}, last enqueued NCCL work: {seq}, last completed NCCL work: {last_done}."
        )
        lines.append(
            job.glog("E", "ProcessGroupNCCL.cpp") + f"{pg}Timeout at NCCL work: {seq}, last enqueued NCCL work: "
            f"{seq}, last completed NCCL work: {last_done}."
        )
    elif at_least(job.era, "2.2"):
        lines.append(
            job.glog("E", "ProcessGroupNCCL.cpp") + f"{pg}Timeout at NCCL work: {seq}, last enqueued NCCL work: "
            f"{seq}, last completed NCCL work: {last_done}."
        )
    tag = f"[Rank {rank}] " if at_least(job.era, "2.2") else ""
    if job.era == "1.9":
        lines.append(
            job.glog("E", "ProcessGroupNCCL.cpp") + "Some NCCL operations have failed or timed out. Due to the "
            "asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete "
            "data. To avoid this inconsistency, we are taking the entire process down."
        )
    else:
        lines.append(
            job.glog("E", "ProcessGroupNCCL.cpp") + f"{tag}Some NCCL operations have failed or timed out. Due to "
            "the asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
            "corrupted/incomplete data."
        )
        lines.append(
            job.glog("E", "ProcessGroupNCCL.cpp") + f"{tag}To avoid data inconsistency, we are taking the entire "
            "process down."
        )
    if at_least(job.era, "2.0"):
        name = "Process group watchdog thread" if at_least(job.era, "2.2") else "NCCL watchdog thread"
        what = f"{pg}{name} terminated with exception: {head}"
        lines.append(job.glog("E", "ProcessGroupNCCL.cpp") + what)
        err = "c10::DistBackendError"
    else:
        what = head
        err = "std::runtime_error"
    lines += [f"terminate called after throwing an instance of '{err}'", f"  what():  {what}"]
    if at_least(job.era, "2.0"):
        lines.append(
            f"Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:"
            f"{rng.randint(500, 700)} (most recent call first):"
        )
        lib = f"{job.site}/torch/lib"
        for i, (call, so) in enumerate(
            (
                ("c10::Error::Error(c10::SourceLocation, std::string)", "libc10.so"),
                (
                    "c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, "
                    "std::ratio<1l, 1000l> > >)",
                    "libtorch_cuda.so",
                ),
                ("c10d::ProcessGroupNCCL::watchdogHandler()", "libtorch_cuda.so"),
                ("c10d::ProcessGroupNCCL::ncclCommWatchdog()", "libtorch_cuda.so"),
            )
        ):
            lines.append(
                f"frame #{i}: {call} + 0x{rng.randrange(16, 4096):x} (0x7f{rng.getrandbits(40):010x} in {lib}/{so})"
            )
        lines.append("")
    return R(job, rank, lines)


def nccl_warn(job: Job, rank: int, warn: str, sources: tuple[str, ...], trail: tuple, code: int) -> list[L]:
    """NCCL's WARN (from one of `sources`) and the NCCLCHECK trail it returns through (NVIDIA/nccl
    src/include/checks.h: INFO "%s:%d -> %d"), each (file, lowest line, highest line) of `trail` with `code`."""
    lines = [job.nccl(rank, "WARN", warn, job.rng.choice(sources))]
    lines += [job.nccl(rank, "INFO", f"{where}:{job.rng.randint(low, high)} -> {code}") for where, low, high in trail]
    return R(job, rank, lines)


def nccl_error_in(job: Job, kind: str) -> list[str]:
    """torch's NCCL error (torch/csrc/distributed/c10d/NCCLUtils.hpp C10D_NCCL_CHECK: "NCCL error in: %s:%d, %s,
    NCCL version %s" with ncclGetErrorString, "(run with NCCL_DEBUG=INFO for details)" from NCCL 2.8; the detail
    of getNcclErrorDetailStr on its own line from 1.12; DistBackendError from 2.1, RuntimeError before; the
    path ../torch/lib/c10d (1.9) or ../torch/csrc/distributed/c10d)."""
    text = {
        "system": "unhandled system error (run with NCCL_DEBUG=INFO for details)",
        "remote": "remote process exited or there was a network error",
        "internal": "internal error - please report this issue to the NCCL developers",
        "cuda": "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
    }[kind]
    # Before NCCL 2.13 (no ncclRemoteError) the detail adds that a peer's exit also shows as a system error.
    remote_note = (
        "It can be also caused by unexpected exit of a remote peer, you can check NCCL warnings for failure reason "
        "and see if there is connection closure by a peer."
    )
    detail = {
        "system": "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device "
        "error. " + ("" if at_least(job.v.nccl_version, "2.13") else remote_note),
        "remote": "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
        "prematurely.",
        "internal": "ncclInternalError: Internal check failed.",
        "cuda": "ncclUnhandledCudaError: Call to CUDA function failed.",
    }[kind]
    if job.era == "1.9":
        text = text.replace(" (run with NCCL_DEBUG=INFO for details)", "")
        path = "../torch/lib/c10d/ProcessGroupNCCL.cpp"
    else:
        path = job.rng.choice(
            (
                "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp",
                "/opt/pytorch/pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp",
                "/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp",
            )
        )
    exc = "torch.distributed.DistBackendError" if at_least(job.era, "2.1") else "RuntimeError"
    if kind == "remote" and not at_least(job.era, "2.0"):
        text = "unhandled system error, NCCL version" if job.era == "1.9" else text
    lines = [f"{exc}: NCCL error in: {path}:{job.rng.randint(800, 3500)}, {text}, NCCL version {job.v.nccl_version}"]
    if job.era != "1.9":
        lines += detail.split("\n")
    return lines


# === Writers =================================================================================================
# Each returns a Failure: its lines (after the preamble), its truth and the right answers.


# --- oom ------------------------------------------------------------------------------------------------------


def w_oom_traceback(job: Job) -> Failure:
    """One rank's CUDA OOM (pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp, see oom_message) in the framework's
    traceback, then the launcher's report of exit code 1."""
    r = job.culprit
    lines = traceback(
        job, r, [f"{oom_exception(job)}: {oom_message(job, job.local(r))}"], job.rng.choice(("backward", "forward"))
    )
    lines += launcher_end(job, [(r, 1)])
    return Failure("oom traceback", lines, "oom")


def w_oom_then_peers(job: Job) -> Failure:
    """An OOM on one rank, its peers' collateral: the remote ranks' NCCL watchdog timeouts (the OOM rank's process
    lingers, or its node's agent waits) or their transport errors (the rank's process gone: NCCL's socket
    "socketProgress: Connection closed by remote peer %s" (NVIDIA/nccl src/misc/socket.cc, 2.19+; "Net : Connection
    closed by remote peer %s" before) and torch's ncclRemoteError/ncclSystemError); then the launcher's report."""
    rng = job.rng
    r = job.culprit
    lines = traceback(
        job, r, [f"{oom_exception(job)}: {oom_message(job, job.local(r))}"], rng.choice(("backward", "forward"))
    )
    peers = job.remote_peers(rng.randint(1, 6)) if job.nodes > 1 else []
    seq = rng.randint(50, 90000)
    op = rng.choice(OPS)
    mode = rng.choice(("timeout", "timeout", "transport"))

    def peer_lines(ps: list[int]) -> list[L]:
        out: list[L] = []
        numel = None
        for p in ps:
            if mode == "timeout":
                numel = rank_numel(op, numel, rng.choice((1, 4096, 1048576, 262144000)))
                out += watchdog_timeout(job, p, seq, op, numel, full=rng.random() < 0.5)
            else:
                peer = f"{job.ips[job.node_of(r)]}<{job.v.port()}>"
                warn = (
                    f"socketProgress: Connection closed by remote peer {job.hosts[job.node_of(r)]}<{job.v.port()}>"
                    if at_least(job.v.nccl_version, "2.19")
                    else f"Net : Connection closed by remote peer {peer}"
                )
                out += R(
                    job,
                    p,
                    [
                        job.nccl(p, "WARN", warn, "misc/socket.cc"),
                        job.nccl(p, "INFO", f"misc/socket.cc:{rng.randint(40, 900)} -> 6"),
                        job.nccl(p, "INFO", f"transport/net_socket.cc:{rng.randint(300, 700)} -> 6"),
                    ],
                )
                out += traceback(job, p, nccl_error_in(job, rng.choice(("remote", "system"))), "backward")
        return out

    lines += cascade(
        job,
        1,
        peer_lines,
        peers,
        -6 if mode == "timeout" else 1,
        job.timeout_ms if mode == "timeout" else rng.randint(100, 5000),
    )
    return Failure("oom then peers' nccl errors", lines, "oom")


def w_oom_nccl(job: Job) -> Failure:
    """NCCL runs out of GPU memory for its buffers: WARN "Cuda failure 'out of memory'" (NVIDIA/nccl
    src/include/checks.h CUDACHECK) or "Failed to CUDA calloc %ld bytes" (NVIDIA/nccl src/include/alloc.h), torch's
    "unhandled cuda error" with ncclUnhandledCudaError and "Last error:" (NCCL 2.13+ ncclGetLastError, torch 2.0+)."""
    rng = job.rng
    r = job.culprit
    warn = rng.choice(
        (
            "Cuda failure 'out of memory'",
            "Cuda failure 2 'out of memory'",
            f"Failed to CUDA calloc {rng.choice((6291456, 10485760, 33554432, 4194304))} bytes",
        )
    )
    sources = ("include/alloc.h", "transport/p2p.cc", "enqueue.cc")
    lines = nccl_warn(job, r, warn, sources, (("transport/p2p.cc", 100, 700), ("init.cc", 800, 1500)), 1)
    last = nccl_error_in(job, "cuda")
    if at_least(job.era, "2.0"):
        last += ["Last error:", warn]
    frames = job.frame("/workspace/train.py", "<module>", "main()") + job.frame(
        "/workspace/train.py", "main", "model = DDP(model, device_ids=[local_rank])"
    )
    frames += job.frame(
        job.tp("nn/parallel/distributed.py"),
        "__init__",
        "_verify_param_shape_across_processes(self.process_group, parameters)",
    )
    lines += traceback(job, r, last, frames=frames)
    lines += launcher_end(job, [(r, 1)])
    return Failure("nccl out of gpu memory", lines, "oom")


def w_oom_math_library(job: Job) -> Failure:
    """cuBLAS/cuDNN cannot get GPU memory: pytorch/pytorch aten/src/ATen/cuda/CublasHandlePool.cpp via
    TORCH_CUDABLAS_CHECK ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    CUBLAS_STATUS_NOT_INITIALIZED (the handle's workspace: OOM, or a library/driver mismatch: ambiguous), cuDNN
    (aten/src/ATen/native/cudnn/Conv_v7.cpp: "Unable to find a valid cuDNN algorithm to run convolution" in 1.x, most
    often a full GPU; aten/src/ATen/cudnn/ Exceptions.h "cuDNN error: CUDNN_STATUS_NOT_INITIALIZED")."""
    rng = job.rng
    r = job.culprit
    message, accept = rng.choice(
        (
            ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", {"oom"}),
            (
                "RuntimeError: CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`",
                {"oom", "environment"},
            ),
            ("RuntimeError: Unable to find a valid cuDNN algorithm to run convolution", {"oom", "environment"}),
            ("RuntimeError: cuDNN error: CUDNN_STATUS_NOT_INITIALIZED", {"oom", "environment"}),
            ("RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED", {"oom"}),
        )
    )
    lines = traceback(job, r, [message], "forward")
    lines += launcher_end(job, [(r, 1)])
    name = "cudnn no valid algorithm" if "valid cuDNN algorithm" in message else "cublas/cudnn out of memory"
    return Failure(
        name,
        lines,
        "oom",
        frozenset(accept),
        "NOT_INITIALIZED and 'no valid cuDNN algorithm' are most often a full GPU, else a library mismatch",
    )


def w_oom_cuda_error(job: Job) -> Failure:
    """cudaMalloc outside the caching allocator (a context, an extension): pytorch/pytorch c10/cuda/CUDAException.cpp
    "CUDA error: out of memory" with the asynchronous note; HIP builds (c10/hip/HIPException.cpp, hipified) "HIP error:
    out of memory"; HIP's allocator message ("HIP out of memory. Tried to allocate ..." from the hipified
    CUDACachingAllocator.cpp, 2.x wording)."""
    rng = job.rng
    r = job.culprit
    shape = rng.choice(("cuda", "hip_alloc", "hip_error"))
    if shape == "cuda":
        last = cuda_error_lines(job, "out of memory", "cudaErrorMemoryAllocation")
    elif shape == "hip_alloc":
        job.era = rng.choice(("2.3", "2.4", "2.6"))
        last = [f"{oom_exception(job)}: {oom_message(job, job.local(r), 'HIP')}"]
    else:
        last = [
            "RuntimeError: HIP error: out of memory",
            "HIP kernel errors might be asynchronously reported at some other "
            "API call, so the stacktrace below might be incorrect.",
            "For debugging consider passing AMD_SERIALIZE_KERNEL=3",
            "Compile with `TORCH_USE_HIP_DSA` to enable device-side assertions.",
        ]
    lines = traceback(job, r, last, "forward")
    lines += launcher_end(job, [(r, 1)])
    return Failure(f"oom {shape}", lines, "oom")


def w_oom_xla(job: Job) -> Failure:
    """PyTorch/XLA on a TPU (the TPU runtime is closed source; the wording as public logs show it, e.g.
    pytorch/xla#3470, huggingface/transformers#22328): XLA's client logs "E tensorflow/compiler/xla/xla_client/
    xla_util.cc:%d]   (0) RESOURCE_EXHAUSTED: Attempting to reserve %s at the bottom of memory. That was not
    possible. There are %s free, %s reserved, and %s reservable." and "[[{{node XRTExecute}}]]", then Python raises
    "RuntimeError: Resource exhausted: From /job:...:" (pytorch/xla#1735); or the compiler's "Bad StatusOr access:
    RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used %s of %s hbm.
    Exceeded hbm capacity by %s." (pytorch/xla#9524 for the form). The device's memory: oom."""
    rng = job.rng
    r = job.culprit
    want, free = rng.uniform(1, 12), rng.uniform(0.2, 8)
    if rng.random() < 0.5:
        text = (
            f"RESOURCE_EXHAUSTED: Attempting to reserve {want:.2f}G at the bottom of memory. That was not possible. "
            f"There are {free:.2f}G free, 0B reserved, and {free * 0.6:.2f}G reservable."
        )
        t = job.tick()
        head = f"{t:%Y-%m-%d %H:%M:%S.%f}: E tensorflow/compiler/xla/xla_client/xla_util.cc:{rng.choice((88, 90))}]"
        lines = R(job, r, [f"{head}   (0) {text}", f"{head} \t [[{{{{node XRTExecute}}}}]]"])
        last = ["RuntimeError: Resource exhausted: From /job:localservice/replica:0/task:0:", text.split(": ", 1)[1]]
        lines += traceback(job, r, last, "backward")
    else:
        cap = rng.choice((15.48, 31.25, 95.74))
        used = cap + rng.uniform(0.5, 20)
        lines = traceback(
            job,
            r,
            [
                f"RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. "
                f"Ran out of memory in memory space hbm. Used {used:.2f}G of {cap}G hbm. Exceeded hbm "
                f"capacity by {used - cap:.2f}G."
            ],
            "forward",
        )
    return Failure("xla resource exhausted", lines, "oom")


# --- host_oom -------------------------------------------------------------------------------------------------


def kernel_prefix(job: Job, style: str, t: datetime, uptime: float) -> str:
    if style == "dmesg":
        return f"[{uptime:12.6f}] "
    if style == "dmesg-T":
        return f"[{t:%a %b %d %H:%M:%S %Y}] "
    return f"{t:%b %d %H:%M:%S} {job.hosts[job.node_of(job.culprit)]} kernel: "


# The allocation's flags as the kernel prints them (%#x(%pGg)).
GFP_MASKS = ("100cca(GFP_HIGHUSER_MOVABLE)", "cc0(GFP_KERNEL)", "140dca(GFP_HIGHUSER_MOVABLE|__GFP_COMP|__GFP_ZERO)")


def oom_killer_lines(job: Job, rank: int) -> list[L]:
    """The kernel's OOM killer (torvalds/linux mm/oom_kill.c): "%s invoked oom-killer: gfp_mask=%#x(%pGg), order=%d,
    oom_score_adj=%hd" (dump_header), "oom-kill:constraint=%s,nodemask=%*pbl,cpuset=..,mems_allowed=..,oom_memcg=..,
    task_memcg=..,task=%s,pid=%d,uid=%d" (5.0+, dump_oom_summary), "%s: Killed process %d (%s) total-vm:%lukB,
    anon-rss:%lukB, file-rss:%lukB, shmem-rss:%lukB, UID:%u pgtables:%lukB oom_score_adj:%hd" (the message "Out of
    memory" or "Memory cgroup out of memory"; before 4.x "Out of memory: Kill process %d (%s) score %u or sacrifice
    child" then "Killed process %d (%s) total-vm:..."), "oom_reaper: reaped process %d (%s), now anon-rss:%lukB,
    file-rss:%lukB, shmem-rss:%lukB"; as dmesg, dmesg -T or journalctl print them."""
    rng = job.rng
    pid = job.pids[rank]
    style = rng.choice(("dmesg", "dmesg-T", "journal"))
    uptime = rng.uniform(1e4, 4e6)
    t = job.tick()
    task = rng.choice(("python", "python3", "pt_main_thread", "python3.10"))
    cg = rng.random() < 0.5
    memcg = (
        f"/slurm/uid_{rng.randint(1000, 60000)}/job_{job.job_id}"
        if rng.random() < 0.5
        else f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{rng.getrandbits(32):08x}.slice"
    )
    anon = rng.randint(20_000_000, 900_000_000)
    out = [f"{task} invoked oom-killer: gfp_mask=0x{rng.choice(GFP_MASKS)}, order=0, oom_score_adj=0"]
    if rng.random() < 0.5:
        out += [
            f"CPU: {rng.randrange(128)} PID: {pid} Comm: {task} Not tainted 5.15.0-{rng.randint(40, 120)}-generic "
            f"#{rng.randint(40, 130)}-Ubuntu",
            "Call Trace:",
            " <TASK>",
            " dump_stack_lvl+0x4a/0x63",
            " dump_header+0x4a/0x1f4",
            " oom_kill_process.cold+0xb/0x10",
            " out_of_memory+0x1bd/0x4f0",
            " </TASK>",
        ]
    old = rng.random() < 0.15
    if not old:
        cgroups = f"oom_memcg={memcg},task_memcg={memcg}/step_0/task_0," if cg else "global_oom,task_memcg=/user.slice,"
        out.append(
            f"oom-kill:constraint={'CONSTRAINT_MEMCG' if cg else 'CONSTRAINT_NONE'},nodemask=(null),cpuset=/,"
            f"mems_allowed=0-1,{cgroups}"
            f"task={task},pid={pid},uid={rng.randint(0, 60000)}"
        )
        what = "Memory cgroup out of memory" if cg else "Out of memory"
        out.append(
            f"{what}: Killed process {pid} ({task}) total-vm:{anon + rng.randint(1_000_000, 90_000_000)}kB, "
            f"anon-rss:{anon}kB, "
            f"file-rss:{rng.randint(10_000, 900_000)}kB, shmem-rss:{rng.randint(0, 9_000_000)}kB, "
            f"UID:{rng.randint(0, 60000)} "
            f"pgtables:{rng.randint(10_000, 900_000)}kB oom_score_adj:0"
        )
    else:
        out += [
            f"Out of memory: Kill process {pid} ({task}) score {rng.randint(500, 999)} or sacrifice child",
            f"Killed process {pid} ({task}) total-vm:{anon + 123456}kB, anon-rss:{anon}kB, file-rss:0kB, shmem-rss:0kB",
        ]
    if rng.random() < 0.5:
        out.append(f"oom_reaper: reaped process {pid} ({task}), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB")
    lines = []
    for text in out:
        uptime += rng.uniform(0, 0.01)
        lines.append(L(kernel_prefix(job, style, t, uptime) + text, KERNEL))
    return lines


def w_host_oom_torchrun(job: Job) -> Failure:
    """The kernel kills one rank for host memory: the rank prints nothing; its launcher reports the signal
    (pytorch/pytorch torch/distributed/elastic: torchrun's "exitcode: -9" and "Signal 9 (SIGKILL) received by PID",
    SchedMD/slurm srun's "Killed", deepspeedai/DeepSpeed's "return code = -9", open-mpi/ompi mpirun's "exited on signal
    9 (Killed)"); peers on other nodes time out or lose the connection; the kernel's lines may be pasted after. Without
    the kernel's lines the SIGKILL could be another sender's (an operator's kill -9, a container runtime): the logs hold
    no other sender; host_oom is the truth."""
    rng = job.rng
    r = job.culprit
    lines: list[L] = []
    if rng.random() < 0.3:
        job.tick()
        lines += R(
            job,
            r,
            f"{job.site}/torch/utils/data/dataloader.py:{rng.randint(500, 700)}: UserWarning: This DataLoader "
            f"will create {rng.choice((16, 32, 64))} worker processes in total. Our suggested max number of worker in "
            f"current system is {rng.choice((8, 12))}, which is smaller than what this DataLoader is going to create.",
        )
    seq, op = rng.randint(50, 90000), rng.choice(OPS)
    peers = job.remote_peers(rng.randint(1, 4)) if job.nodes > 1 and rng.random() < 0.6 else []

    def peer_lines(ps: list[int]) -> list[L]:
        return [x for p in ps for x in watchdog_timeout(job, p, seq, op, 1048576, full=rng.random() < 0.4)]

    if job.launcher == "ray":
        job.v.clock += timedelta(milliseconds=job.timeout_ms)
        lines += peer_lines(peers)
    else:
        lines += cascade(job, -9, peer_lines, peers, -6, job.timeout_ms)
    if job.launcher == "ray" or rng.random() < 0.4:
        lines += oom_killer_lines(job, r)
    if not _shows_the_kill(lines):  # the launcher may print no report of the culprit (launcher_end): the kernel's
        lines += oom_killer_lines(job, r)
    return Failure("host oom kill (launcher report)", lines, "host_oom")


# How a launcher reports a child that SIGKILL ended: torchrun's "exitcode: -9" and "Signal 9 (SIGKILL)", DeepSpeed's
# "return code = -9", srun's "Killed", mpirun's "exited on signal 9 (Killed)".
_KILL_REPORTED = re.compile(r"-9\b|SIGKILL|signal 9|\bKilled\b")


def _shows_the_kill(lines: list[L]) -> bool:
    """Whether the lines show the SIGKILL at all: the kernel's OOM-killer lines, or a launcher's report of signal 9
    (a peer's SIGABRT report alone shows only the timeout it met)."""
    return any(
        line.kind == KERNEL or (line.kind in (AGENT, LAUNCHER) and _KILL_REPORTED.search(line.text)) for line in lines
    )


def w_host_oom_slurm(job: Job) -> Failure:
    """Slurm's cgroup OOM report: slurmstepd (SchedMD/slurm src/plugins/task/cgroup/task_cgroup_memory.c, later
    src/plugins/cgroup/; both wordings are in public job logs): 21.08+
    "Detected %u oom_kill event%s in %ps. Some of the step tasks have been OOM Killed."; older "Detected %u oom-kill
    event(s) in step %u.%u cgroup. Some of your processes may have been killed by the cgroup out-of-memory
    handler."; srun: "srun: error: %s: task %d: Out Of Memory"; the batch script's bash: "%s: line %d: %d Killed
    %s"."""
    rng = job.rng
    r = job.culprit
    host = job.hosts[job.node_of(r)]
    n = rng.randint(1, 3)
    lines: list[L] = []
    if rng.random() < 0.3:
        lines.append(
            L(
                f"/var/spool/slurmd/job{job.job_id}/slurm_script: line {rng.randint(20, 90)}: {job.pids[r]} Killed"
                f"                  python3 train.py --config configs/run.yaml",
                LAUNCHER,
            )
        )
    stepd = rng.choice(
        ("slurmstepd: error: ", f"slurmstepd-{host}: error: ", f"[{job.tick():%Y-%m-%dT%H:%M:%S.%f}"[:-3] + "] error: ")
    )
    if rng.random() < 0.7:
        step = rng.choice((f"{job.job_id}.0", f"{job.job_id}.batch"))
        lines.append(
            L(
                f"{stepd}Detected {n} oom_kill event{'s' if n > 1 else ''} in StepId={step}. Some of the step tasks "
                "have been OOM Killed.",
                LAUNCHER,
            )
        )
    else:
        lines.append(
            L(
                f"{stepd}Detected {n} oom-kill event(s) in step {job.job_id}.batch cgroup. Some of your processes "
                "may have been killed by the cgroup out-of-memory handler.",
                LAUNCHER,
            )
        )
    if rng.random() < 0.7:
        lines.append(
            L(f"srun: error: {host}: task {r if job.launcher == 'srun' else job.node_of(r)}: Out Of Memory", LAUNCHER)
        )
    # Under torchrun srun's task is a node, which the log need not show: no claim on the rank named.
    return Failure("slurm oom kill", lines, "host_oom", culprits=None if job.launcher == "srun" else frozenset())


def w_host_oom_k8s(job: Job) -> Failure:
    """Kubernetes: the kubelet reports a container the kernel killed for its cgroup's memory as Reason OOMKilled, Exit
    Code 137 (kubernetes/kubernetes pkg/kubelet/kuberuntime; kubernetes/kubectl pkg/describe/describe.go: kubectl
    describe pod's "State: Terminated / Reason: OOMKilled / Exit Code: 137", kubectl get pods' STATUS column); the
    Kubeflow training operator's events."""
    rng = job.rng
    pod = f"{rng.choice(('pytorchjob', 'trainer', 'llm-sft'))}-worker-{job.node_of(job.culprit)}"
    t = job.tick()
    lines = [L("", LAUNCHER)]
    if rng.random() < 0.5:
        lines += [
            L(x, LAUNCHER)
            for x in [
                "    State:          Terminated",
                "      Reason:       OOMKilled",
                "      Exit Code:    137",
                f"      Started:      {t - timedelta(hours=3):%a, %d %b %Y %H:%M:%S} +0000",
                f"      Finished:     {t:%a, %d %b %Y %H:%M:%S} +0000",
                "    Ready:          False",
                f"    Restart Count:  {rng.randint(0, 3)}",
            ]
        ]
    else:
        lines += [
            L("NAME                    READY   STATUS      RESTARTS   AGE", LAUNCHER),
            L(f"{pod:<24}0/1     OOMKilled   {rng.randint(0, 3)}          {rng.randint(5, 59)}m", LAUNCHER),
        ]
    return Failure("kubernetes OOMKilled", lines, "host_oom")


def w_host_oom_process(job: Job) -> Failure:
    """Host memory exhausted where Python sees it: pytorch/pytorch torch/utils/data/_utils/signal_handling.py
    "DataLoader worker (pid %d) is killed by signal: %s. " (strsignal: Killed); c10/core/impl/alloc_cpu.cpp
    "DefaultCPUAllocator: can't allocate memory: you tried to allocate %d bytes. Error code 12 (Cannot allocate memory)"
    (c10/core/impl/ alloc_cpu.cpp), after CAFFE_ENFORCE's "[enforce fail at alloc_cpu.cpp:%d] err == 0. " (2.x) or, in
    1.x (c10/core/CPUAllocator.cpp), CAFFE_THROW's "[enforce fail at CPUAllocator.cpp:%d] . "."""
    rng = job.rng
    r = job.culprit
    if rng.random() < 0.5:
        frames = training_frames(job, "forward")[:4]
        frames += job.frame(job.tp("utils/data/dataloader.py"), "__next__", "data = self._next_data()")
        frames += job.frame(
            job.tp("utils/data/dataloader.py"),
            "_try_get_data",
            "raise RuntimeError(f'DataLoader worker (pid(s) {pids_str}) exited unexpectedly') from e",
        )
        wpid = rng.randint(1000, 4000000)
        first = traceback(
            job,
            r,
            [f"RuntimeError: DataLoader worker (pid {wpid}) is killed by signal: Killed. "],
            frames=job.frame(job.tp("utils/data/_utils/signal_handling.py"), "handler", "_error_if_any_worker_fails()"),
        )
        second = R(job, r, ["", "The above exception was the direct cause of the following exception:", ""])
        second += traceback(
            job, r, [f"RuntimeError: DataLoader worker (pid(s) {wpid}) exited unexpectedly"], frames=frames
        )
        lines = first + second
        shape = "dataloader worker killed"
    else:
        n = rng.choice((8589934592, 17179869184, 34359738368, 268435456000))
        if at_least(job.era, "2.0"):
            msg = (
                f"RuntimeError: [enforce fail at alloc_cpu.cpp:{rng.choice((83, 114, 117))}] err == 0. "
                f"DefaultCPUAllocator: can't allocate memory: you tried to allocate {n} bytes. Error code 12 "
                "(Cannot allocate memory)"
            )
        else:
            msg = (
                f"RuntimeError: [enforce fail at CPUAllocator.cpp:{rng.choice((64, 68, 71))}] . "
                f"DefaultCPUAllocator: can't allocate memory: you tried to allocate {n} bytes. Error code 12 "
                "(Cannot allocate memory)"
            )
        frames = job.frame("/workspace/train.py", "<module>", "main()") + job.frame(
            "/workspace/train.py", "main", "state = torch.load(args.resume, map_location='cpu')"
        )
        frames += job.frame(job.tp("serialization.py"), "load", "return _load(")
        lines = traceback(job, r, [msg], frames=frames)
        shape = "cpu allocator"
    lines += launcher_end(job, [(r, 1)])
    return Failure(f"host oom ({shape})", lines, "host_oom")


# --- gpu_fault ------------------------------------------------------------------------------------------------

XIDS = {
    # NVIDIA's Xid catalogue; the driver's message text after "pid=%s, name=%s, " (NVIDIA/open-gpu-kernel-modules
    # src/nvidia/src/kernel/gpu/rc/kernel_rc.c krcReportXid / nvErrorLog_va), each text as public kernel logs show it.
    79: ("GPU has fallen off the bus.", {"gpu_fault"}),
    48: (
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition {a}, "
        "subpartition {b}.",
        {"gpu_fault"},
    ),
    94: ("Contained: SM (0x1). RST: No, D-RST: No", {"gpu_fault"}),
    95: ("Uncontained: FBHUB. RST: Yes, D-RST: No", {"gpu_fault"}),
    119: (
        "Timeout after 6s of waiting for RPC response from GPU{a} GSP! Expected function 76 (GSP_RM_CONTROL) "
        "(0x20803039 0x8).",
        {"gpu_fault"},
    ),
    74: ("NVLink: fatal error detected on link {a}(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)", {"gpu_fault"}),
    13: ("Graphics SM Warp Exception on (GPC {a}, TPC {b}, SM 0): Out Of Range Address", {"gpu_fault", "usage"}),
    31: (
        "Ch 0000{a:04x}, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_{b} faulted @ 0x7f{b}_{a:04x}0000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
        {"gpu_fault", "usage"},
    ),
}
XID_CUDA = {
    79: [("unspecified launch failure", "cudaErrorLaunchFailure"), ("unknown error", "cudaErrorUnknown")],
    48: [("uncorrectable ECC error encountered", "cudaErrorECCUncorrectable")],
    94: [("uncorrectable ECC error encountered", "cudaErrorECCUncorrectable")],
    95: [
        ("uncorrectable ECC error encountered", "cudaErrorECCUncorrectable"),
        ("unspecified launch failure", "cudaErrorLaunchFailure"),
    ],
    119: [("unknown error", "cudaErrorUnknown"), ("unspecified launch failure", "cudaErrorLaunchFailure")],
    74: [
        ("uncorrectable NVLink error was detected during the execution", "cudaErrorNvlinkUncorrectable"),
        ("unspecified launch failure", "cudaErrorLaunchFailure"),
    ],
    13: [("an illegal memory access was encountered", "cudaErrorIllegalAddress")],
    31: [("an illegal memory access was encountered", "cudaErrorIllegalAddress")],
}


def xid_lines(job: Job, xid: int, rank: int) -> list[L]:
    """The driver's line (NVIDIA/open-gpu-kernel-modules src/nvidia/src/kernel/gpu/rc/kernel_rc.c: "NVRM: Xid
    (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s"; the process unknown: pid='<unknown>', name=<unknown>) as
    dmesg, dmesg -T or journalctl print it; for Xid 79 also nv.c's multi-line report "NVRM: GPU at
    PCI:%04x:%02x:%02x: %s" / "NVRM: The NVIDIA GPU %04x:%02x:%02x.%x\\nNVRM: (PCI ID: %04x:%04x) installed in this
    system has\\nNVRM: fallen off the bus and is not responding to commands.\\n"."""
    rng = job.rng
    style = rng.choice(("dmesg", "dmesg-T", "journal"))
    t = job.tick()
    uptime = rng.uniform(1e4, 4e6)
    pci = f"0000:{job.pci_bus}:00"
    text, _ = XIDS[xid]
    text = text.format(a=rng.randrange(1, 12), b=rng.randrange(0, 8))
    if rng.random() < 0.6:
        who = f"pid={job.pids[rank]}, name={rng.choice(('python', 'python3', 'pt_main_thread'))}, "
    else:
        who = "pid='<unknown>', name=<unknown>, "
    out = [f"NVRM: Xid (PCI:{pci}): {xid}, {who}{text}"]
    if xid == 79 and rng.random() < 0.5:
        out += [
            f"NVRM: GPU at PCI:{pci}: "
            f"GPU-{rng.getrandbits(32):08x}-{rng.getrandbits(16):04x}-{rng.getrandbits(16):04x}-{rng.getrandbits(16):04x}-{rng.getrandbits(48):012x}",
            "NVRM: GPU Board Serial Number: " + str(rng.randint(10**12, 10**13 - 1)),
            f"NVRM: Xid (PCI:{pci}): 154, pid='<unknown>', name=<unknown>, GPU recovery action changed from 0x0 "
            "(None) to 0x2 (Node Reboot Required)",
        ]
    if xid == 48 and rng.random() < 0.5:
        out.append(
            f"NVRM: Xid (PCI:{pci}): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row marked for remapping, "
            "reset gpu to activate."
        )
    lines = []
    for x in out:
        uptime += rng.uniform(0, 0.2)
        lines.append(L(kernel_prefix(job, style, t, uptime) + x, KERNEL))
    return lines


def fallen_off_multiline(job: Job) -> list[L]:
    """nv.c (NVIDIA/open-gpu-kernel-modules kernel-open/nvidia/nv.c nv_check_gpu_state / nvidia_probe): the report of a
    GPU that stopped answering, over three lines, as newer drivers print it with no Xid."""
    rng = job.rng
    t = job.tick()
    uptime = rng.uniform(1e4, 4e6)
    style = rng.choice(("dmesg", "dmesg-T", "journal"))
    dev = rng.choice(("2330", "26b5", "20b0", "20b2", "2335"))
    out = [
        f"NVRM: The NVIDIA GPU 0000:{job.pci_bus}:00.0",
        f"NVRM: (PCI ID: 10de:{dev}) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
    ]
    return [L(kernel_prefix(job, style, t, uptime + i * 1e-5) + x, KERNEL) for i, x in enumerate(out)]


def w_xid_then_cuda(job: Job) -> Failure:
    """A GPU's hardware or driver fault: the rank's next CUDA call fails (pytorch/pytorch c10/cuda/CUDAException.cpp
    "CUDA error: %s": unspecified launch failure, uncorrectable ECC error encountered, unknown error, an illegal memory
    access was encountered, uncorrectable NVLink error), peers time out or fail in NCCL, and the node's kernel log
    (pasted after) holds the Xid, always where the CUDA error is "unknown error", which alone names no fault. Xid 13
    and 31 with an illegal address are most often a kernel's own out-of-bounds
    access (a program bug) rather than the hardware: usage is an honest answer there."""
    rng = job.rng
    r = job.culprit
    xid = rng.choice((79, 79, 48, 94, 95, 119, 74, 13, 31))
    error, code = rng.choice(XID_CUDA[xid])
    where = rng.choice(("traceback", "watchdog"))
    lines: list[L] = []
    if where == "traceback":
        lines += traceback(
            job,
            r,
            cuda_error_lines(
                job,
                error,
                code,
                rng.choice(
                    ("RuntimeError", "torch.AcceleratorError") if at_least(job.era, "2.6") else ("RuntimeError",)
                ),
            ),
            "backward",
        )
    else:
        pg = job.pg_prefix(r)
        head = f"{pg}Process group watchdog thread terminated with exception: CUDA error: {error}"
        lines += R(
            job,
            r,
            [job.glog("E", "ProcessGroupNCCL.cpp") + head]
            + cuda_error_lines(job, error, code)[1:]
            + [
                "",
                "Exception raised from c10_cuda_check_implementation at ../c10/cuda/CUDAException.cpp:43 (most recent "
                "call first):",
                "terminate called after throwing an instance of 'c10::DistBackendError'",
                f"  what():  {head}",
            ],
        )
    peers = job.remote_peers(rng.randint(1, 4)) if job.nodes > 1 and rng.random() < 0.5 else []
    seq, op = rng.randint(50, 90000), rng.choice(OPS)
    lines += cascade(
        job,
        1 if where == "traceback" else -6,
        lambda ps: [x for p in ps for x in watchdog_timeout(job, p, seq, op, 1048576, full=False)],
        peers,
        -6,
        job.timeout_ms,
    )
    # "unknown error" alone names no fault: the kernel's Xid line is what says the GPU failed.
    if rng.random() < 0.85 or error == "unknown error":
        lines += xid_lines(job, xid, r)
    return Failure(f"xid {xid} then cuda error", lines, "gpu_fault", frozenset(XIDS[xid][1]))


def w_fallen_off_bus(job: Job) -> Failure:
    """The GPU is gone: nvidia-smi's report (closed source, the wording as public logs show it: "Unable to determine the
    device handle for GPU%s: %s" with "Unknown Error" or "GPU is lost.  Reboot the system to recover this GPU"), the
    rank's "CUDA error: unknown error" or NCCL's "Cuda failure 'unknown error'", the kernel's multi-line nv.c report or
    the Xid 79 line."""
    rng = job.rng
    r = job.culprit
    lines: list[L] = []
    if rng.random() < 0.5:
        lines += traceback(job, r, cuda_error_lines(job, "unknown error", "cudaErrorUnknown"), "backward")
    else:
        warn = "Cuda failure 'unknown error'" if rng.random() < 0.5 else "Cuda failure 999 'unknown error'"
        lines += R(job, r, [job.nccl(r, "WARN", warn, rng.choice(("enqueue.cc", "proxy.cc")))])
        lines += traceback(
            job, r, nccl_error_in(job, "cuda") + (["Last error:", warn] if at_least(job.era, "2.0") else []), "backward"
        )
    lines += launcher_end(job, [(r, 1)])
    tail = rng.choice(("multiline", "xid", "smi"))
    if tail == "multiline":
        lines += fallen_off_multiline(job)
    elif tail == "xid":
        lines += xid_lines(job, 79, r)
    else:
        lines += [
            L("$ nvidia-smi", LAUNCHER),
            L(
                f"Unable to determine the device handle for GPU0000:{job.pci_bus.upper()}:00.0: "
                f"{rng.choice(('Unknown Error', 'GPU is lost.  Reboot the system to recover this GPU'))}",
                LAUNCHER,
            ),
        ]
    return Failure(f"gpu fallen off the bus ({tail})", lines, "gpu_fault")


def w_device_assert(job: Job) -> Failure:
    """A kernel's assertion (pytorch/pytorch aten/src/ATen/native/cuda/Loss.cu nll_loss "Assertion `t >= 0 && t <
    n_classes` failed.", Indexing.cu indexSelectLargeIndex "Assertion `srcIndex < srcSelectDimSize` failed.",
    ScatterGatherKernel.cu "Assertion `idx_dim >= 0 && idx_dim < index_size && \\"index out of bounds\\"` failed.", the
    device's printf of __assert_fail: "%s:%d: %s: block: [%d,%d,%d], thread: [%d,%d,%d] Assertion `%s` failed.") then
    "CUDA error: device-side assert triggered" (pytorch/pytorch c10/cuda/CUDAException.cpp). The mechanism is a program
    bug (a label or index out of range); the rules file it under gpu_fault: both are right answers."""
    rng = job.rng
    r = job.culprit
    src, fn, cond = rng.choice(
        (
            ("Loss.cu", "nll_loss_forward_reduce_cuda_kernel_2d", "t >= 0 && t < n_classes"),
            ("Indexing.cu", "indexSelectLargeIndex", "srcIndex < srcSelectDimSize"),
            ("Indexing.cu", "indexSelectSmallIndex", "srcIndex < srcSelectDimSize"),
            ("ScatterGatherKernel.cu", "operator()", 'idx_dim >= 0 && idx_dim < index_size && "index out of bounds"'),
            ("IndexKernel.cu", "operator()", 'index >= -sizes[i] && index < sizes[i] && "index out of bounds"'),
        )
    )
    root = rng.choice(
        (
            "../aten/src/ATen/native/cuda",
            "/opt/pytorch/pytorch/aten/src/ATen/native/cuda",
            "/pytorch/aten/src/ATen/native/cuda",
        )
    )
    line = rng.randint(90, 1500)
    printed = [
        f"{root}/{src}:{line}: {fn}: block: [{rng.randrange(512)},0,0], thread: [{t},0,0] Assertion `{cond}` failed."
        for t in sorted(rng.sample(range(128), rng.randint(1, 6)))
    ]
    lines = R(job, r, printed)
    lines += traceback(job, r, cuda_error_lines(job, "device-side assert triggered", "cudaErrorAssert"), "forward")
    lines += launcher_end(job, [(r, 1)])
    return Failure(
        "device-side assert",
        lines,
        "gpu_fault",
        frozenset({"gpu_fault", "usage"}),
        "a label/index out of range (usage) reported by the GPU (rules: gpu_fault)",
    )


# --- nan_inf --------------------------------------------------------------------------------------------------


def w_nan_loss_stop(job: Job) -> Failure:
    """A loop that stops on a non-finite loss: facebookresearch/detr engine.py (and its forks: DINO, Deformable-DETR,
    MAE's engine_pretrain.py) print("Loss is {}, stopping training".format(loss_value)) then the loss dict, and
    sys.exit(1); timm's train.py line "Train: %d [%4d/%d (%3.0f%%)]  Loss: %#.3g (%#.3g)" before it."""
    rng = job.rng
    r = job.culprit
    lines: list[L] = []
    epoch = rng.randint(0, 300)
    for i in range(rng.randint(2, 8)):
        lines += R(
            job,
            0,
            f"Epoch: [{epoch}]  [{i * 10:4d}/{rng.choice((1250, 2502, 5004))}]  eta: "
            f"0:{rng.randint(10, 59):02d}:{rng.randint(10, 59):02d}  "
            f"lr: {rng.uniform(1e-5, 1e-4):.6f}  loss: {rng.uniform(5, 40):.4f} ({rng.uniform(5, 40):.4f})  time: "
            f"{rng.uniform(0.2, 2):.4f}  data: {rng.uniform(0, 0.1):.4f}  max mem: {rng.randint(5000, 70000)}",
        )
    value = rng.choice(("nan", "inf", "-inf"))
    lines += R(
        job,
        r,
        [
            f"Loss is {value}, stopping training",
            f"{{'loss_ce': tensor({value}, device='cuda:{job.local(r)}', grad_fn=<MulBackward0>), 'loss_bbox': "
            f"tensor({rng.uniform(0, 2):.4f}, device='cuda:{job.local(r)}', grad_fn=<MulBackward0>)}}",
        ],
    )
    lines += launcher_end(job, [(r, 1)])
    return Failure("loss is nan, stopping training", lines, "nan_inf")


def w_megatron_nan(job: Job) -> Failure:
    """Megatron's NaN check (NVIDIA/Megatron-LM megatron/core/distributed/param_and_grad_buffer.py / distributed_data_
    parallel.py check_for_nan_in_grad: f"Rank {global_rank}: found NaN in local grad norm in backward pass before
    data-parallel communication collective. Device: {device}, node: {hostname}"), raised as AssertionError (older)
    or RuntimeError via rerun_state_machine; the iteration line's loss as "{:.6E}" of nan prints "NAN"."""
    rng = job.rng
    r = job.culprit
    job.style = "megatron"
    steps = Steps(job.v, "megatron")
    lines = [
        L(x.text, RANK, rank=job.world - 1, node=job.node_of(job.world - 1)) for x in steps.lines(rng.randint(2, 6))
    ]
    if rng.random() < 0.5:
        bad = steps.next().text
        bad = (
            bad.split("| lm loss:")[0]
            + "| lm loss: NAN | loss scale: 1.0 | grad norm: nan | number of skipped iterations:   0 | number of nan "
            "iterations:   1 |"
        )
        lines += R(job, job.world - 1, bad)
    msg = (
        f"Rank {r}: found NaN in local grad norm in backward pass before data-parallel communication collective. "
        f"Device: {job.local(r)}, node: {job.hosts[job.node_of(r)]}"
    )
    frames = training_frames(job, "backward")
    frames += job.frame(
        "/workspace/Megatron-LM/megatron/core/distributed/param_and_grad_buffer.py",
        "start_grad_sync",
        "raise AssertionError(" if rng.random() < 0.5 else "assert not norm.isnan().item(), (",
    )
    lines += traceback(job, r, [f"AssertionError: {msg}"], frames=frames)
    lines += launcher_end(job, [(r, 1)])
    return Failure("megatron nan in grad norm", lines, "nan_inf")


def w_loss_scale_exhausted(job: Job) -> Failure:
    """Dynamic loss scaling that runs out: DeepSpeed (deepspeedai/DeepSpeed deepspeed/runtime/fp16/loss_scaler.py
    update_scale: "[deepspeed] OVERFLOW! Rank %d Skipping step. Attempted loss scale: %s, reducing to %s", then raise
    Exception "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."), apex (NVIDIA/apex
    apex/amp/handle.py "Gradient overflow.  Skipping step, loss scaler %d reducing loss scale to %s"), fairseq's
    FloatingPointError (facebookresearch/fairseq fairseq/optim/dynamic_loss_scaler.py "Minimum loss scale reached (%s).
    Your loss is probably exploding. Try lowering the learning rate, using gradient clipping or increasing the batch
    size.")."""
    rng = job.rng
    r = job.culprit
    shape = rng.choice(("deepspeed", "apex", "fairseq"))
    lines: list[L] = []
    scale = 2.0 ** rng.randint(4, 12)
    if shape == "deepspeed":
        while scale > 1:
            t = job.tick()
            lines += R(
                job,
                0,
                f"[{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d}] [INFO] [loss_scaler.py:183:update_scale] "
                f"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {int(scale)}, reducing to "
                f"{int(scale // 2)}",
            )
            scale /= 2
        frames = training_frames(job, "backward")[:6] + job.frame(
            f"{job.site}/deepspeed/runtime/fp16/loss_scaler.py", "update_scale", "raise Exception("
        )
        lines += traceback(
            job,
            r,
            ["Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."],
            frames=frames,
        )
    elif shape == "apex":
        scale = 2.0 ** rng.randint(-2, 4)
        for _ in range(rng.randint(4, 16)):
            scale /= 2
            lines += R(job, 0, f"Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {scale!r}")
    else:
        frames = job.frame(
            f"{job.site}/fairseq/trainer.py",
            "train_step",
            "grad_norm = self.clip_grad_norm(self.cfg.optimization.clip_norm)",
        )
        frames += job.frame(
            f"{job.site}/fairseq/optim/dynamic_loss_scaler.py", "check_overflow", "raise FloatingPointError("
        )
        lines += R(
            job,
            0,
            [
                f"{job.v.iso(False)} | INFO | fairseq.trainer | NOTE: gradient overflow detected, ignoring gradient, "
                f"setting loss scale to: {2.0**-k}"
                for k in range(8, 14)
            ],
        )
        lines += traceback(
            job,
            r,
            [
                "FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably exploding. Try "
                "lowering the learning rate, using gradient clipping or increasing the batch size."
            ],
            frames=frames,
        )
    if shape != "apex":
        lines += launcher_end(job, [(r, 1)])
    return Failure(f"loss scale exhausted ({shape})", lines, "nan_inf")


def w_nan_checks(job: Job) -> Failure:
    """torch's own checks (pytorch/pytorch): anomaly mode (torch/csrc/autograd/python_anomaly_mode.cpp warning "Error
    detected in %s. Traceback of forward call that caused the error:", engine.cpp "Function '%s' returned nan values in
    its %zuth output."), clip_grad_norm_ (torch/nn/utils/clip_grad.py "The total norm of order %s for gradients from
    `parameters` is non-finite, so it cannot be clipped. To disable this error and scale the gradients by the non-finite
    norm anyway, set `error_if_nonfinite=False`"), Lightning's EarlyStopping (Lightning-AI/pytorch-lightning
    src/lightning/pytorch/callbacks/ early_stopping.py "Monitored metric %s = %s is not finite. Previous best value was
    %s. Signaling Trainer to stop.")."""
    rng = job.rng
    r = job.culprit
    shape = rng.choice(("anomaly", "clip", "lightning", "hf_log"))
    lines: list[L] = []
    if shape == "anomaly":
        fn = rng.choice(
            ("LogSoftmaxBackward0", "DivBackward0", "SqrtBackward0", "PowBackward0", "NativeLayerNormBackward0")
        )
        lines += R(
            job,
            r,
            [
                f"{job.tp('autograd/graph.py')}:{rng.randint(700, 830)}: UserWarning: Error detected in {fn}. "
                "Traceback of forward call that caused the error:"
            ]
            + job.frame("/workspace/model.py", "forward", "x = torch.log_softmax(logits, dim=-1)")
            + [" (Triggered internally at ../torch/csrc/autograd/python_anomaly_mode.cpp:111.)"],
        )
        lines += traceback(
            job, r, [f"RuntimeError: Function '{fn}' returned nan values in its 0th output."], "backward"
        )
    elif shape == "clip":
        frames = training_frames(job, "forward")[:4] + job.frame(
            job.tp("nn/utils/clip_grad.py"), "clip_grad_norm_", "raise RuntimeError("
        )
        lines += traceback(
            job,
            r,
            [
                "RuntimeError: The total norm of order 2.0 for gradients from `parameters` is non-finite, so it "
                "cannot be "
                "clipped. To disable this error and scale the gradients by the non-finite norm anyway, set "
                "`error_if_nonfinite=False`"
            ],
            frames=frames,
        )
    elif shape == "lightning":
        lines += R(
            job,
            0,
            [
                f"Epoch {rng.randint(1, 30)}: 100%|##########| 1000/1000 [05:{rng.randint(10, 59)}<00:00,  "
                f"3.{rng.randint(10, 99)}it/s, loss=nan, v_num=0]",
                f"Monitored metric val_loss = nan is not finite. Previous best value was {rng.uniform(0.2, 3):.3f}. "
                "Signaling Trainer to stop.",
            ],
        )
    else:
        for _ in range(rng.randint(2, 6)):
            lines += R(
                job,
                0,
                f"{{'loss': nan, 'grad_norm': nan, 'learning_rate': {rng.uniform(1e-6, 3e-4):.4e}, 'epoch': "
                f"{rng.uniform(0, 3):.2f}}}",
            )
    if shape in ("anomaly", "clip"):
        lines += launcher_end(job, [(r, 1)])
    return Failure(f"torch/framework nan check ({shape})", lines, "nan_inf")


def w_benign_overflow_then(job: Job) -> Failure:
    """DeepSpeed's loss-scale warm-up (healthy OVERFLOW lines of deepspeedai/DeepSpeed
    deepspeed/runtime/fp16/loss_scaler.py) early, steps after it at a stable
    scale, then another failure: a CUDA OOM (see oom_message) or a watchdog timeout. The truth is the later failure."""
    rng = job.rng
    job.launcher = "deepspeed"
    job.prefix = "deepspeed"
    lines: list[L] = []
    scale = 2**16
    for _ in range(rng.randint(2, 6)):
        t = job.tick()
        lines += R(
            job,
            0,
            f"[{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d}] [INFO] [loss_scaler.py:183:update_scale] "
            f"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {scale}, reducing to {scale // 2}",
        )
        scale //= 2
    lines += [L(x.text, RANK, rank=0, node=0) for x in job.steps.lines(rng.randint(3, 15))]
    if rng.random() < 0.5:
        r = job.culprit
        lines += traceback(job, r, [f"{oom_exception(job)}: {oom_message(job, job.local(r))}"], "backward")
        lines += deepspeed_end(job, r, 1)
        return Failure("deepspeed warm-up overflow, then oom", lines, "oom")
    seq, op = rng.randint(50, 90000), rng.choice(OPS)
    for p in job.peers(rng.randint(1, 4), exclude={-1}):
        lines += watchdog_timeout(job, p, seq, op, 1048576, full=rng.random() < 0.5)
    lines += deepspeed_end(job, job.culprit, -6)
    # Every rank that timed out aborts; the launcher names whichever it saw first: no claim on the culprit.
    return Failure(
        "deepspeed warm-up overflow, then watchdog timeout",
        lines,
        "nccl_timeout",
        frozenset({"nccl_timeout", "hang"}),
        culprits=frozenset(),
    )


# --- nccl_timeout ---------------------------------------------------------------------------------------------


def w_watchdog_timeout(job: Job) -> Failure:
    """Every reporting rank's watchdog timeout in its release's wording (see watchdog_timeout), optionally with 2.6's
    dump lines (pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp "Received a dump signal due to a
    collective timeout from this local rank and we will try our best to dump the debug info. Last enqueued NCCL work:
    %d, last completed NCCL work: %d.This is most likely caused by ..."), then the launcher's report of SIGABRT. The
    culprit (a rank that never joined) prints nothing: nccl_timeout, or hang."""
    rng = job.rng
    seq, op = rng.randint(2, 90000), rng.choice(OPS)
    reporters = job.peers(rng.randint(1, min(8, job.world)))  # the culprit never joined: it prints nothing
    lines: list[L] = []
    job.v.clock += timedelta(milliseconds=job.timeout_ms)
    numel = None
    for p in reporters:
        numel = rank_numel(op, numel, rng.choice((1, 4096, 1048576, 262144000)))
        lines += watchdog_timeout(job, p, seq, op, numel, full=rng.random() < 0.6)
        if at_least(job.era, "2.6") and rng.random() < 0.4:
            pg = job.pg_prefix(p)
            lines += R(
                job,
                p,
                job.glog("E", "ProcessGroupNCCL.cpp") + f"{pg}Received a dump signal due to a collective timeout "
                "from this local rank and we will try our best to dump the debug info. Last enqueued NCCL work: "
                f"{seq}, last "
                f"completed NCCL work: {seq - 1}.This is most likely caused by incorrect usages of collectives, e.g., "
                "wrong "
                "sizes used across ranks, the order of collectives is not same for all ranks or the scheduled "
                "collective, for "
                "some reason, didn't run. Additionally, this can be caused by GIL deadlock or other reasons such as "
                "network "
                "errors or bugs in the communications library (e.g. NCCL), etc. ",
            )
    lines += launcher_end(job, [(p, -6) for p in reporters])
    return Failure(f"watchdog timeout (torch {job.era})", lines, "nccl_timeout", frozenset({"nccl_timeout", "hang"}))


def w_communicator_aborted(job: Job) -> Failure:
    """Blocking wait (NCCL_BLOCKING_WAIT=1 / TORCH_NCCL_BLOCKING_WAIT=1): the training thread raises. 1.10-1.13:
    pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp WorkNCCL::checkAndThrowException "NCCL communicator
    was aborted on rank %d.  Original reason for failure was: %s" (with the watchdog's message); 1.8-1.9 "NCCL
    communicator was aborted."; 2.2+: WorkNCCL::synchronizeInternal "Work %s timed out in blocking wait
    (TORCH_NCCL_BLOCKING_WAIT=1)." in a DistBackendError. Inside a collective in the traceback."""
    rng = job.rng
    seq, op = rng.randint(2, 90000), rng.choice(OPS)
    reporters = job.peers(rng.randint(1, min(6, job.world)))  # the culprit never joined: it prints nothing
    lines: list[L] = []
    job.v.clock += timedelta(milliseconds=job.timeout_ms)
    for p in reporters:
        work = work_nccl(job, seq, op, 1048576)
        ran = job.timeout_ms + rng.randint(1, 900)
        if at_least(job.era, "2.2"):
            exc = (
                f"torch.distributed.DistBackendError: [Rank {p}] Work {work} timed out in blocking wait "
                "(TORCH_NCCL_BLOCKING_WAIT=1)."
            )
        elif job.era == "1.9":
            exc = "RuntimeError: NCCL communicator was aborted."
        else:
            exc = (
                f"RuntimeError: NCCL communicator was aborted on rank {p}.  Original reason for failure was: [Rank "
                f"{p}] "
                f"Watchdog caught collective operation timeout: {work} ran for {ran} milliseconds before timing out."
            )
        frames = training_frames(job, "forward")[:6]
        frames += job.frame(
            job.tp("distributed/c10d_logger.py" if at_least(job.era, "2.1") else "distributed/distributed_c10d.py"),
            "wrapper" if at_least(job.era, "2.1") else "all_reduce",
            "return func(*args, **kwargs)" if at_least(job.era, "2.1") else "work.wait()",
        )
        frames += job.frame(job.tp("distributed/distributed_c10d.py"), "all_reduce", "work.wait()")
        lines += traceback(job, p, [exc], frames=frames)
    lines += launcher_end(job, [(p, 1) for p in reporters])
    return Failure(
        f"communicator aborted / blocking wait (torch {job.era})",
        lines,
        "nccl_timeout",
        frozenset({"nccl_timeout", "hang"}),
    )


# --- nccl_transport -------------------------------------------------------------------------------------------


def w_ib_completion(job: Job) -> Failure:
    """An IB completion error (NVIDIA/nccl src/transport/net_ib.cc ncclIbTest: "NET/IB : Got completion from peer %s
    with error %d, opcode %d, len %d, vendor err %d (%s)%s%s%s%s" before 2.19, "with status=%d opcode=%d len=%d vendor
    err %d (%s)%s%s%s%s" after, the localGid/remoteGids and hca), NCCL's trail ("%s:%d -> %d"), then torch's error:
    ncclRemoteError (NCCL 2.13+: "remote process exited or there was a network error") or ncclSystemError, with "Last
    error:" and the WARN again (2.0+), in the training traceback or the watchdog's async report."""
    rng = job.rng
    r = job.culprit
    peer = f"{job.ips[(job.node_of(r) + 1) % job.nodes]}<{job.v.port()}>"
    status = rng.choice((12, 12, 13, 4, 5, 10))
    old = not at_least(job.v.nccl_version, "2.19")
    if old:
        warn = (
            f"NET/IB : Got completion from peer {peer} with error {status}, opcode {rng.randrange(3)}, len "
            f"{rng.randrange(1 << 20)}, vendor err {rng.randint(100, 250)} (Recv)"
        )
    else:
        warn = (
            f"NET/IB: Got completion from peer {peer} with status={status} opcode={rng.randrange(3)} "
            f"len={rng.randrange(1 << 20)} "
            f"vendor err {rng.randint(100, 250)} (Recv) localGid ::ffff:{job.ips[job.node_of(r)]} "
            f"remoteGids::ffff:{peer.split('<')[0]} hca mlx5_{rng.randrange(8)}"
        )
    lines = R(
        job,
        r,
        [
            job.nccl(r, "WARN", warn, "transport/net_ib.cc"),
            job.nccl(r, "INFO", f"transport/net_ib.cc:{rng.randint(1000, 2400)} -> 6"),
            job.nccl(r, "INFO", f"transport/net.cc:{rng.randint(1000, 1400)} -> 6"),
            job.nccl(r, "INFO", f"proxy.cc:{rng.randint(600, 1700)} -> 6 [Progress Thread]"),
        ],
    )
    kind = "remote" if at_least(job.v.nccl_version, "2.13") and rng.random() < 0.7 else "system"
    err = nccl_error_in(job, kind) + (["Last error:", warn] if at_least(job.era, "2.0") else [])
    if at_least(job.era, "2.2") and rng.random() < 0.5:
        pg = job.pg_prefix(r)
        head = f"{pg}Process group watchdog thread terminated with exception: NCCL error: " + err[0].split(", ", 1)[1]
        lines += R(
            job,
            r,
            [job.glog("E", "ProcessGroupNCCL.cpp") + head]
            + err[1:]
            + ["terminate called after throwing an instance of 'c10::DistBackendError'", f"  what():  {head}"],
        )
        code = -6
    else:
        lines += traceback(job, r, err, "backward")
        code = 1
    lines += launcher_end(job, [(r, code)])
    return Failure("nccl ib completion error", lines, "nccl_transport")


def w_socket_errors(job: Job) -> Failure:
    """NCCL's socket transport: NVIDIA/nccl src/misc/socket.cc (2.19+) "socketStartConnect: Connect to %s failed : %s",
    "socketProgress: Connection closed by remote peer %s", "socketProgressOpt: Call to recv from %s failed : %s";
    2.12-2.18 "Net : Connect to %s failed : %s", "Net : Connection closed by remote peer %s", "Net : Call to recv from
    %s failed : %s"; the proxy's (src/proxy.cc) "[Proxy Service %d] Failed to execute operation %s from rank %d, retcode
    %d"; torch's unhandled system error. A closed connection is often the remote process dying (its own failure not in
    these lines): nccl_transport is what the lines show."""
    rng = job.rng
    r = job.culprit
    peer_node = (job.node_of(r) + 1) % job.nodes
    peer = f"{job.ips[peer_node]}<{job.v.port()}>"
    new = at_least(job.v.nccl_version, "2.19")
    reason = rng.choice(
        (
            "Connection refused",
            "Connection reset by peer",
            "No route to host",
            "Software caused connection abort",
            "Connection timed out",
        )
    )
    shape = rng.choice(("connect", "closed", "recv"))
    if shape == "connect":
        warn = (
            f"socketStartConnect: Connect to {peer} failed : {reason}"
            if new
            else f"Net : Connect to {peer} failed : {reason}"
        )
    elif shape == "closed":
        warn = (
            f"socketProgress: Connection closed by remote peer {job.hosts[peer_node]}<{job.v.port()}>"
            if new
            else f"Net : Connection closed by remote peer {peer}"
        )
    else:
        warn = (
            f"socketProgressOpt: Call to recv from {peer} failed : {reason}"
            if new
            else f"Net : Call to recv from {peer} failed : {reason}"
        )
    out = [
        job.nccl(r, "WARN", warn, "misc/socket.cc"),
        job.nccl(r, "INFO", f"misc/socket.cc:{rng.randint(40, 900)} -> 6"),
    ]
    if rng.random() < 0.5:
        out.append(
            job.nccl(
                r,
                "WARN",
                f"[Proxy Service {r}] Failed to execute operation Connect from rank {r}, retcode 6",
                "proxy.cc",
            )
        )
    if shape == "connect":
        out.append(job.nccl(r, "INFO", f"transport/net_socket.cc:{rng.randint(300, 700)} -> 6"))
        out.append(job.nccl(r, "INFO", f"transport/net.cc:{rng.randint(600, 900)} -> 6"))
    lines = R(job, r, out)
    err = nccl_error_in(job, "system") + (["Last error:", warn] if at_least(job.era, "2.0") else [])
    lines += traceback(job, r, err, "backward")
    lines += launcher_end(job, [(r, 1)])
    return Failure(f"nccl socket ({shape})", lines, "nccl_transport")


def w_nccl_no_interface(job: Job) -> Failure:
    """NCCL finds no interface: NVIDIA/nccl src/misc/socket.cc, src/bootstrap.cc, src/transport/net_socket.cc "Bootstrap
    : no socket interface found", "NET/Socket : No usable listening interface found", "Net : No interface found in the
    same subnet as remote address %s"; torch's ncclInternalError ("internal error - please report this issue to the NCCL
    developers") or unhandled system error. A configuration of the environment (NCCL_SOCKET_IFNAME) as much as a
    transport fault: both are right."""
    rng = job.rng
    r = job.culprit
    warn = rng.choice(
        (
            "Bootstrap : no socket interface found",
            "NET/Socket : No usable listening interface found",
            f"Net : No interface found in the same subnet as remote address {job.ips[0]}<{job.v.port()}>",
        )
    )
    sources = ("bootstrap.cc", "misc/socket.cc", "transport/net_socket.cc")
    lines = nccl_warn(job, r, warn, sources, (("init.cc", 100, 300), ("init.cc", 1000, 1500)), 3)
    err = nccl_error_in(job, "internal") + (["Last error:", warn] if at_least(job.era, "2.0") else [])
    frames = job.frame("/workspace/train.py", "<module>", "main()") + job.frame(
        "/workspace/train.py", "main", "dist.barrier()"
    )
    frames += job.frame(job.tp("distributed/distributed_c10d.py"), "barrier", "work = default_pg.barrier(opts=opts)")
    lines += traceback(job, r, err, frames=frames)
    lines += launcher_end(job, [(r, 1)])
    return Failure("nccl no socket interface", lines, "nccl_transport", frozenset({"nccl_transport", "environment"}))


# --- rendezvous -----------------------------------------------------------------------------------------------


def w_tcpstore_connect(job: Job) -> Failure:
    """A rank cannot reach the store: pytorch/pytorch torch/csrc/distributed/c10d/socket.cpp (1.12+) warns at each retry
    "[c10d] The client socket has failed to connect to [%s]:%d (errno: %d - %s)." and finally throws "The client socket
    has timed out after %s while trying to connect to (%s, %d)." (RuntimeError up to 2.0, DistNetworkError 2.1+); 1.9's
    TCPStore wording was not found in the stored sources: a job of 1.9 is written as 1.12."""
    rng = job.rng
    r = job.culprit
    if job.era == "1.9":  # socket.cpp's messages came with 1.12; 1.9's TCPStore wording is not reproduced here
        job.era = "1.12"
    master = rng.choice((job.hosts[0], job.ips[0], "master-0", "trainer-0.trainer-headless.default.svc"))
    port = rng.choice((29500, 29400, 23456, 12355))
    lines: list[L] = []
    for _ in range(rng.randint(1, 6)):
        head = (
            job.glog("W", "socket.cpp")
            if at_least(job.era, "2.4")
            else f"[W socket.cpp:{rng.choice((426, 558, 601, 663))}] "
        )
        lines += R(
            job,
            r,
            f"{head}[c10d] The client socket has failed to connect to [{master}]:{port} (errno: "
            f"{rng.choice(('111 - Connection refused', '110 - Connection timed out', '113 - No route to host'))}).",
        )
    frames = job.frame("/workspace/train.py", "<module>", "main()") + job.frame(
        "/workspace/train.py", "main", 'dist.init_process_group(backend="nccl")'
    )
    frames += job.frame(
        job.tp("distributed/rendezvous.py"),
        "_env_rendezvous_handler",
        "store = _create_c10d_store(master_addr, master_port, rank, world_size, timeout, use_libuv)",
    )
    frames += job.frame(job.tp("distributed/rendezvous.py"), "_create_c10d_store", "return TCPStore(")
    exc = "torch.distributed.DistNetworkError" if at_least(job.era, "2.1") else "RuntimeError"
    last = (
        f"{exc}: The client socket has timed out after {job.dist_timeout_s}s while trying to connect to ({master}, "
        f"{port})."
    )
    lines += traceback(job, r, [last], frames=frames)
    lines += launcher_end(job, [(r, 1)])
    return Failure("tcpstore client timed out", lines, "rendezvous")


def w_tcpstore_listen(job: Job) -> Failure:
    """The store cannot listen: pytorch/pytorch torch/csrc/distributed/c10d/socket.cpp (1.12-2.3) "The server socket has
    failed to listen on any local network address. The server socket has failed to bind to [::]:%d (errno: 98 - Address
    already in use). The server socket has failed to bind to 0.0.0.0:%d (errno: 98 - Address already in use)."; the
    libuv store (2.4+, torch/csrc/distributed/c10d/TCPStoreLibUvBackend.cpp) "The server socket has failed to listen on
    any local network address. port: %d, useIpv6: %d, code: %d, name: %s, message: %s"; in the agent (torchrun's rdzv)
    or the rank."""
    rng = job.rng
    r = job.culprit
    port = rng.choice((29500, 29400, 12355))
    if at_least(job.era, "2.4"):
        text = (
            f"The server socket has failed to listen on any local network address. port: {port}, useIpv6: 0, code: "
            "-98, "
            "name: EADDRINUSE, message: address already in use"
        )
    else:
        text = (
            "The server socket has failed to listen on any local network address. The server socket has failed to "
            "bind "
            f"to [::]:{port} (errno: 98 - Address already in use). The server socket has failed to bind to "
            f"0.0.0.0:{port} "
            "(errno: 98 - Address already in use)."
        )
    exc = "torch.distributed.DistNetworkError" if at_least(job.era, "2.1") else "RuntimeError"
    frames = job.frame("/usr/local/bin/torchrun", "<module>", "sys.exit(main())")
    frames += job.frame(
        job.tp("distributed/elastic/rendezvous/c10d_rendezvous_backend.py"), "_create_tcp_store", "store = TCPStore("
    )
    body = ["Traceback (most recent call last):"] + frames + [f"{exc}: {text}"]
    if at_least(job.era, "2.0") and rng.random() < 0.6:
        body += [
            "",
            "The above exception was the direct cause of the following exception:",
            "",
            "Traceback (most recent call last):",
        ]
        body += frames[:2] + job.frame(
            job.tp("distributed/elastic/rendezvous/c10d_rendezvous_backend.py"),
            "create_backend",
            "raise RendezvousConnectionError(",
        )
        body.append(
            "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has "
            "failed. See inner exception for details."
        )
    lines = [L(t, AGENT, node=job.node_of(r)) for t in body]
    return Failure("tcpstore listen failed", lines, "rendezvous")


def w_store_barrier(job: Job) -> Failure:
    """Not every rank arrives (pytorch/pytorch): TCPStore's wait for its workers
    (torch/csrc/distributed/c10d/TCPStore.cpp waitForWorkers: "Timed out after %d seconds waiting for clients. %d/%d
    clients joined."), the store-based barrier (torch/distributed/distributed_c10d.py _store_based_barrier: "Timed out
    initializing process group in store based barrier on rank %s, for key: %s (world_size=%s, num_workers_joined=%s,
    timeout=%s error=%s)" (2.x) / "... on rank: %s, for key: %s (world_size=%s, worker_count=%s, timeout=%s)" (1.x)),
    NCCL's unique id fetch (ProcessGroupNCCL.cpp broadcastUniqueNCCLID: "[%d] is setting up NCCL communicator and
    retrieving ncclUniqueId from [0] via c10d key-value store by key '%s', but store->get('%s') got error: %s")."""
    rng = job.rng
    r = job.culprit
    shape = rng.choice(("clients", "barrier", "uniqueid"))
    joined = rng.randint(1, max(1, job.world - 1))
    if shape == "clients":
        exc = "torch.distributed.DistStoreError" if at_least(job.era, "2.1") else "RuntimeError"
        last = (
            f"{exc}: Timed out after {job.dist_timeout_s + 1} seconds waiting for clients. {joined}/{job.world} "
            "clients joined."
        )
    elif shape == "barrier":
        exc = "torch.distributed.DistStoreError" if at_least(job.era, "2.1") else "RuntimeError"
        if at_least(job.era, "2.0"):
            last = (
                f"{exc}: Timed out initializing process group in store based barrier on rank {r}, for key: "
                f"store_based_barrier_key:1 (world_size={job.world}, num_workers_joined={joined}, timeout=0:30:00)"
            )
        else:
            last = (
                f"RuntimeError: Timed out initializing process group in store based barrier on rank: {r}, for key: "
                f"store_based_barrier_key:1 (world_size={job.world}, worker_count={joined}, timeout=0:30:00)"
            )
    else:
        exc = "torch.distributed.DistBackendError" if at_least(job.era, "2.1") else "RuntimeError"
        err = rng.choice(
            ("Socket Timeout", f"wait timeout after {job.dist_timeout_s * 1000}ms, keys: /default_pg//0//cuda//0")
        )
        last = (
            f"{exc}: [{r}] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value "
            "store "
            f"by key '0', but store->get('0') got error: {err}"
        )
    frames = job.frame("/workspace/train.py", "<module>", "main()") + job.frame(
        "/workspace/train.py", "main", 'dist.init_process_group(backend="nccl")'
    )
    frames += job.frame(
        job.tp("distributed/distributed_c10d.py"),
        "init_process_group",
        "_store_based_barrier(rank, store, group_name, world_size, timeout)"
        if shape == "barrier"
        else "default_pg, _ = _new_process_group_helper(",
    )
    lines = traceback(job, r, [last], frames=frames)
    lines += launcher_end(job, [(r, 1)])
    return Failure(f"store wait ({shape})", lines, "rendezvous")


# --- environment ----------------------------------------------------------------------------------------------


def w_environment(job: Job) -> Failure:
    """Set-up problems, as torch (pytorch/pytorch) and the loader print them: torch/cuda/__init__.py _check_driver ("The
    NVIDIA driver on your system is too old (found version %s). Please update your GPU driver by downloading and
    installing a new version from the URL: http://www.nvidia.com/Download/index.aspx Alternatively, go to:
    https://pytorch.org to install a PyTorch version that has been compiled with your version of the CUDA driver."),
    cudaGetErrorString ("CUDA driver version is insufficient for CUDA runtime version"), the dynamic loader (glibc
    dlerror: "%s: cannot open shared object file: No such file or directory", "%s: undefined symbol: %s"),
    torch/cuda/__init__.py _lazy_init ("Torch not compiled with CUDA enabled" (AssertionError), "No CUDA GPUs are
    available"), ProcessGroupNCCL.cpp ("ProcessGroupNCCL is only supported with GPUs, no GPUs found!"),
    c10/cuda/CUDAFunctions.cpp ("Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before
    calling NumCudaDevices() that might have already set an error? Error %d: %s"), torch/cuda/__init__.py
    _check_capability ("%s with CUDA capability sm_%d%d is not compatible with the current PyTorch installation.") and
    "no kernel image is available for execution on the device"."""
    rng = job.rng
    r = job.culprit
    frames = job.frame("/workspace/train.py", "<module>", "main()") + job.frame(
        "/workspace/train.py", "main", "torch.cuda.set_device(local_rank)"
    )
    frames += job.frame(
        job.tp("cuda/__init__.py"),
        "set_device" if rng.random() < 0.5 else "_lazy_init",
        "torch._C._cuda_setDevice(device)" if rng.random() < 0.5 else "torch._C._cuda_init()",
    )
    shape = rng.choice(
        (
            "driver_old",
            "driver_insufficient",
            "libmissing",
            "undefined_symbol",
            "no_gpus",
            "not_compiled",
            "pg_no_gpu",
            "error_802",
            "no_kernel_image",
        )
    )
    pre: list[str] = []
    if shape == "driver_old":
        last = [
            "RuntimeError: The NVIDIA driver on your system is too old (found version "
            f"{rng.choice((11040, 11060, 11080, 12020))}). Please update your GPU driver by downloading and "
            "installing a new version from the URL: http://www.nvidia.com/Download/index.aspx Alternatively, go to: "
            "https://pytorch.org to install a PyTorch version that has been compiled with your version of the CUDA "
            "driver."
        ]
    elif shape == "driver_insufficient":
        last = cuda_error_lines(
            job, "CUDA driver version is insufficient for CUDA runtime version", "cudaErrorInsufficientDriver"
        )
    elif shape == "libmissing":
        lib = rng.choice(("libnccl.so.2", "libcudnn.so.8", "libcudart.so.12", "libcublasLt.so.12", "libmpi.so.40"))
        frames = job.frame("/workspace/train.py", "<module>", "import torch") + job.frame(
            f"{job.site}/torch/__init__.py", "<module>", "_load_global_deps()"
        )
        frames += job.frame(
            f"{job.site}/torch/__init__.py", "_load_global_deps", "ctypes.CDLL(lib_path, mode=ctypes.RTLD_GLOBAL)"
        )
        last = [f"OSError: {lib}: cannot open shared object file: No such file or directory"]
    elif shape == "undefined_symbol":
        mod, sym = rng.choice(
            (
                ("flash_attn_2_cuda", "_ZN3c104cuda9SetDeviceEi"),
                ("transformer_engine_torch", "_ZN3c1017RegisterOperatorsD1Ev"),
                (
                    "amp_C",
                    "_ZN2at4_ops19empty_memory_format4callEN3c108ArrayRefINS2_6SymIntEEESt8optionalINS2_10ScalarTypeEES6_INS2_6LayoutEES6_INS2_6DeviceEES6_IbES6_INS2_12MemoryFormatEE",
                ),
                ("torch/lib/libtorch_cuda", "ncclCommRegister"),
            )
        )
        frames = job.frame("/workspace/train.py", "<module>", "from flash_attn import flash_attn_func")
        frames += job.frame(
            f"{job.site}/flash_attn/flash_attn_interface.py", "<module>", "import flash_attn_2_cuda as flash_attn_cuda"
        )
        path = (
            f"{job.site}/{mod}.cpython-{job.v.python.replace('.', '')}-x86_64-linux-gnu.so"
            if "/" not in mod
            else f"{job.site}/{mod}.so"
        )
        last = [f"ImportError: {path}: undefined symbol: {sym}"]
    elif shape == "no_gpus":
        last = ["RuntimeError: No CUDA GPUs are available"]
    elif shape == "not_compiled":
        frames = frames[:-2] + job.frame(
            job.tp("cuda/__init__.py"), "_lazy_init", 'raise AssertionError("Torch not compiled with CUDA enabled")'
        )
        last = ["AssertionError: Torch not compiled with CUDA enabled"]
    elif shape == "pg_no_gpu":
        frames = job.frame("/workspace/train.py", "<module>", "main()") + job.frame(
            job.tp("distributed/distributed_c10d.py"), "_new_process_group_helper", "backend_class = ProcessGroupNCCL("
        )
        exc = "torch.distributed.DistBackendError" if at_least(job.era, "2.1") else "RuntimeError"
        last = [f"{exc}: ProcessGroupNCCL is only supported with GPUs, no GPUs found!"]
    elif shape == "error_802":
        code, text = rng.choice(
            ((802, "system not yet initialized"), (804, "forward compatibility was attempted on non supported HW"))
        )
        pre = [
            f"{job.tp('cuda/__init__.py')}:{rng.randint(100, 800)}: UserWarning: CUDA initialization: Unexpected "
            "error from cudaGetDeviceCount(). "
            "Did you run some cuda functions before calling NumCudaDevices() that might have already set an error? "
            f"Error {code}: {text} "
            "(Triggered internally at ../c10/cuda/CUDAFunctions.cpp:108.)",
            "  return torch._C._cuda_getDeviceCount() > 0",
        ]
        last = ["RuntimeError: No CUDA GPUs are available"] if rng.random() < 0.5 else cuda_error_lines(job, text, None)
    else:
        gpu, sm = rng.choice(
            (
                ("NVIDIA H100 80GB HBM3", "90"),
                ("NVIDIA B200", "100"),
                ("NVIDIA GeForce RTX 5090", "120"),
                ("NVIDIA A100-SXM4-80GB", "80"),
            )
        )
        pre = [
            f"{job.tp('cuda/__init__.py')}:{rng.randint(100, 300)}: UserWarning: ",
            f"{gpu} with CUDA capability sm_{sm} is not compatible with the current PyTorch installation.",
            "The current PyTorch install supports CUDA capabilities sm_37 sm_50 sm_60 sm_70 sm_75.",
            "If you want to use the "
            + gpu
            + " GPU with PyTorch, please check the instructions at https://pytorch.org/get-started/locally/",
            "",
            '  warnings.warn(incompatible_device_warn.format(device_name, capability, " ".join(arch_list), '
            "device_name))",
        ]
        frames = training_frames(job, "forward")
        last = cuda_error_lines(
            job, "no kernel image is available for execution on the device", "cudaErrorNoKernelImageForDevice"
        )
    lines = R(job, r, pre) + traceback(job, r, last, frames=frames)
    lines += launcher_end(job, [(r, 1)])
    return Failure(f"environment ({shape})", lines, "environment")


# --- usage ----------------------------------------------------------------------------------------------------


def w_usage(job: Job) -> Failure:
    """Program bugs as torch (pytorch/pytorch) raises them: aten/src/ATen/native/LinearAlgebra.cpp ("mat1 and mat2
    shapes cannot be multiplied (%dx%d and %dx%d)"), aten/src/ATen/native/TensorIterator / TensorCompare ("Expected all
    tensors to be on the same device, but found at least two devices, %s and %s!" and, 2.x, " (when checking argument
    for argument %s in method %s)"), torch/distributed/distributed_c10d.py _get_default_group ("Default process group
    has not been initialized, please make sure to call init_process_group." RuntimeError <2.1, ValueError after),
    torch/csrc/ distributed/c10d/reducer.cpp ensure_prior_reduction_finished ("Expected to have finished reduction in
    the prior iteration before starting a new one. This error indicates that your module has parameters that were not
    used in producing loss. You can enable unused parameter detection by passing the keyword argument
    `find_unused_parameters=True` to `torch.nn.parallel.DistributedDataParallel`, ..." with "Parameter indices which did
    not receive grad for rank %d: %s"), argparse (python/cpython Lib/argparse.py "%(prog)s: error: unrecognized
    arguments: %s": torch 2.0's launcher passing --local-rank)."""
    rng = job.rng
    r = job.culprit
    shape = rng.choice(("matmul", "device", "default_pg", "ddp_unused", "local_rank"))
    ranks = [r]
    if shape == "matmul":
        a, b, c = (
            rng.choice((8, 16, 32, 64, 128)),
            rng.choice((512, 768, 1024, 4096)),
            rng.choice((256, 1000, 10, 2048)),
        )
        lines = traceback(
            job,
            r,
            [
                f"RuntimeError: mat1 and mat2 shapes cannot be multiplied ({a}x{b} and "
                f"{b // 2 if rng.random() < 0.5 else b * 2}x{c})"
            ],
            "forward",
        )
    elif shape == "device":
        msg = (
            "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, "
            f"cuda:{job.local(r)} and cpu!"
        )
        if at_least(job.era, "1.12") and rng.random() < 0.7:
            msg += rng.choice(
                (
                    " (when checking argument for argument mat1 in method wrapper_CUDA_addmm)",
                    " (when checking argument for argument index in method wrapper_CUDA__index_select)",
                    " (when checking argument for argument target in method wrapper_CUDA_nll_loss_forward)",
                )
            )
        lines = traceback(job, r, [msg], "forward")
    elif shape == "default_pg":
        exc = "ValueError" if at_least(job.era, "2.1") else "RuntimeError"
        frames = job.frame("/workspace/train.py", "<module>", "main()") + job.frame(
            "/workspace/train.py", "main", "world_size = dist.get_world_size()"
        )
        frames += job.frame(
            job.tp("distributed/distributed_c10d.py"), "get_world_size", "return _get_group_size(group)"
        )
        frames += job.frame(
            job.tp("distributed/distributed_c10d.py"),
            "_get_default_group",
            "raise ValueError(" if exc == "ValueError" else "raise RuntimeError(",
        )
        lines = traceback(
            job,
            r,
            [f"{exc}: Default process group has not been initialized, please make sure to call init_process_group."],
            frames=frames,
        )
    elif shape == "ddp_unused":
        ranks = job.peers(rng.randint(1, min(4, job.world)), exclude={-1})
        lines = []
        for p in ranks:
            idx = " ".join(str(i) for i in sorted(rng.sample(range(40, 400), rng.randint(1, 6))))
            frames = training_frames(job, "forward")[:6] + job.frame(
                job.tp("nn/parallel/distributed.py"),
                "forward",
                "if torch.is_grad_enabled() and self.reducer._rebuild_buckets():",
            )
            lines += traceback(
                job,
                p,
                [
                    "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new "
                    "one. This error indicates that your "
                    "module has parameters that were not used in producing loss. You can enable unused parameter "
                    "detection by passing the keyword "
                    "argument `find_unused_parameters=True` to `torch.nn.parallel.DistributedDataParallel`, and by ",
                    "making sure all `forward` function outputs participate in calculating loss. ",
                    "If you already have done the above, then the distributed data parallel module wasn't able to "
                    "locate the output tensors in the "
                    "return value of your module's `forward` function. Please include the loss function and the "
                    "structure of the return value of "
                    "`forward` of your module when reporting this issue (e.g. list, dict, iterable).",
                    f"Parameter indices which did not receive grad for rank {p}: {idx}",
                    " In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or "
                    "DETAIL to print out information "
                    "about which particular parameters did not receive gradient on this rank as part of this error",
                ],
                frames=frames,
            )
    else:
        job.era = "2.0"
        lines = R(
            job,
            r,
            [
                "usage: train.py [-h] [--config CONFIG] [--local_rank LOCAL_RANK]",
                "train.py: error: unrecognized arguments: --local-rank=" + str(job.local(r)),
            ],
        )
        if job.launcher == "torchrun":
            lines = [
                L(
                    "/usr/local/lib/python3.10/dist-packages/torch/distributed/launch.py:181: FutureWarning: The "
                    "module torch.distributed.launch is "
                    "deprecated",
                    AGENT,
                    node=0,
                ),
                L("and will be removed in future. Use torchrun.", AGENT, node=0),
            ] + lines
        return Failure("usage (--local-rank argument)", lines + launcher_end(job, [(r, 2)]), "usage")
    lines += launcher_end(job, [(p, 1) for p in ranks])
    return Failure(f"usage ({shape})", lines, "usage")


# --- hang -----------------------------------------------------------------------------------------------------


def w_hang_pyspy(job: Job) -> Failure:
    """The job stops printing; a py-spy dump (benfred/py-spy src/dump.rs: "Process %d: %s", "Python v%s (%s)", "Thread
    %#x (%s): \\"%s\\"", "    %s (%s:%d)") shows ranks inside a collective, or Ctrl-C's KeyboardInterrupt inside
    distributed_c10d.py. No error printed: hang (a watchdog timeout had not yet fired; nccl_timeout is a fair answer
    where a collective is named)."""
    rng = job.rng
    lines: list[L] = []
    if rng.random() < 0.5:
        for r in job.peers(rng.randint(1, 3), exclude={-1}):
            lines += [
                L(f"Process {job.pids[r]}: /usr/bin/python3 -u train.py --config configs/run.yaml", LAUNCHER),
                L(f"Python v{job.v.python}.{rng.randint(0, 12)} (/usr/bin/python{job.v.python})", LAUNCHER),
                L("", LAUNCHER),
                L(f'Thread {job.pids[r]} (idle): "MainThread"', LAUNCHER),
                L(f"    all_reduce ({job.tp('distributed/distributed_c10d.py')}:{rng.randint(1500, 2800)})", LAUNCHER),
                L(f"    wrapper ({job.tp('distributed/c10d_logger.py')}:{rng.randint(50, 90)})", LAUNCHER),
                L(f"    reduce_loss (/workspace/train.py:{rng.randint(50, 400)})", LAUNCHER),
                L(f"    main (/workspace/train.py:{rng.randint(50, 400)})", LAUNCHER),
                L(f"    <module> (/workspace/train.py:{rng.randint(400, 500)})", LAUNCHER),
                L("", LAUNCHER),
            ]
        shape = "py-spy dump"
    else:
        r = rng.randrange(job.world)
        frames = training_frames(job, "forward")[:6] + job.frame(
            job.tp("distributed/distributed_c10d.py"), "all_reduce", "work.wait()"
        )
        lines += R(job, r, ["^C"]) + traceback(job, r, ["KeyboardInterrupt"], frames=frames)
        shape = "ctrl-c in collective"
    return Failure(f"hang ({shape})", lines, "hang", frozenset({"hang", "nccl_timeout"}))


# --- deepep ---------------------------------------------------------------------------------------------------


def w_deepep_then_peers(job: Job) -> Failure:
    """A DeepEP kernel's timeout printf (deepseek-ai/DeepEP csrc/kernels/*.cu, the formats of long_tail_formats
    _KERNEL_PRINTF) on one rank, its trap's "CUDA error: unspecified launch failure", then the other ranks of the
    job's NCCL watchdog timeouts (their next collective never completes)."""
    rng = job.rng
    r = job.culprit
    job.style = rng.choice(("megatron", "plain"))
    shape = rng.choice(sorted(_KERNEL_PRINTF))
    form, values = _KERNEL_PRINTF[shape]
    job.v.rank = r
    lines = R(job, r, [form % values(job.v, rng) for _ in range(rng.randint(1, 4))])
    lines += traceback(job, r, cuda_error_lines(job, "unspecified launch failure", "cudaErrorLaunchFailure"), "forward")
    seq, op = rng.randint(50, 90000), rng.choice(("ALLTOALL_BASE", "_ALLGATHER_BASE", "ALLREDUCE"))
    peers = job.remote_peers(rng.randint(1, 4)) if job.nodes > 1 else []
    lines += cascade(
        job,
        1,
        lambda ps: [x for p in ps for x in watchdog_timeout(job, p, seq, op, 1048576, full=rng.random() < 0.4)],
        peers,
        -6,
        job.timeout_ms,
    )
    return Failure(f"deepep {shape} then peers' timeouts", lines, "deepep")


# --- The writers --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Writer:
    category: str
    write: Callable[[Job], Failure]
    phase: str = "training"
    # Whether the writer's lines put the failure on the job's culprit rank, the others' lines being what it did to
    # them (or leave it silent: a rank that never joined prints nothing): then a verdict that names ranks names it.
    # False where any rank may be the one its lines show (a program bug every rank meets, a NaN only rank 0 logs,
    # ranks' stacks in a collective, a DeepEP timeout that names the peer it waited for). A writer's Failure may
    # say otherwise (`culprits`).
    names_culprit: bool = True


WRITERS = (
    Writer("oom", w_oom_traceback),
    Writer("oom", w_oom_then_peers),
    Writer("oom", w_oom_nccl, "init"),
    Writer("oom", w_oom_math_library),
    Writer("oom", w_oom_cuda_error),
    Writer("oom", w_oom_xla),
    Writer("host_oom", w_host_oom_torchrun),
    Writer("host_oom", w_host_oom_slurm),
    Writer("host_oom", w_host_oom_k8s),
    Writer("host_oom", w_host_oom_process),
    Writer("gpu_fault", w_xid_then_cuda),
    Writer("gpu_fault", w_fallen_off_bus),
    Writer("gpu_fault", w_device_assert),
    Writer("nan_inf", w_nan_loss_stop),
    Writer("nan_inf", w_megatron_nan),
    Writer("nan_inf", w_loss_scale_exhausted),
    Writer("nan_inf", w_nan_checks, names_culprit=False),
    Writer("mixed", w_benign_overflow_then),
    Writer("nccl_timeout", w_watchdog_timeout),
    Writer("nccl_timeout", w_communicator_aborted),
    Writer("nccl_transport", w_ib_completion),
    Writer("nccl_transport", w_socket_errors),
    Writer("nccl_transport", w_nccl_no_interface, "init"),
    Writer("rendezvous", w_tcpstore_connect, "startup"),
    Writer("rendezvous", w_tcpstore_listen, "launch"),
    Writer("rendezvous", w_store_barrier, "startup"),
    Writer("environment", w_environment, "startup"),
    Writer("usage", w_usage, names_culprit=False),
    Writer("hang", w_hang_pyspy, names_culprit=False),
    Writer("deepep", w_deepep_then_peers, names_culprit=False),
)
