"""What the programs print, for the generated logs of the long tail (tests/long_tail_logs.py).

Each writer follows a real format string, cited beside it (the library's file and function, the format as
printed), and fills it with the values of one made-up job (`Values`): ranks, world sizes, hosts, pids, addresses,
ports, sizes, time stamps. Around the failures, the ordinary output of training (`preamble`): torchrun's
start-up warning, Python's warnings, NCCL's start-up lines, healthy lines that hold the words of failures, and
the step lines of Megatron, Hugging Face, Lightning, fairseq or a plain loop.

The writers of the six classes are listed in `WRITERS`, each with the phases of a job it can fail in (before the
launcher starts a rank, at start-up, in NCCL's init, in training) and the training styles around it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

CLASSES = ("cascade", "nonfinite", "signal", "nccl_lines", "rendezvous", "traceback")

# Who printed a line, for the launchers' prefixes: the rank's own process, the per-node agent that started
# it (torchrun, DeepSpeed's launch.py: srun's label covers it, torchrun's own prefixes do not), or the
# launcher of the whole job (mpirun, srun itself: nothing prefixes its own messages).
RANK, AGENT, LAUNCHER = "rank", "agent", "launcher"


@dataclass
class Line:
    """One line of a log, and who printed it."""

    text: str
    owner: str = RANK


@dataclass
class Failure:
    """What a writer of a class makes: the failure's lines and their truth."""

    shape: str
    lines: list[Line]
    truth: str
    accept: frozenset[str] = frozenset()  # every right answer, where more than the truth is (default: the truth)
    own_error: bool = False  # a library's own error: its generic CUDA cascade may follow
    # The ranks the failure's lines name as the peers the printer waited for, which a verdict may name besides the
    # printer: job ranks (DeepEP's src_rank), and ranks within the printer's node (its NVLink peers' `thread`).
    peers: frozenset[int] = frozenset()
    node_peers: frozenset[int] = frozenset()


# --- Values -------------------------------------------------------------------------------------------------


class Values:
    """The made-up values of one job: its ranks, hosts, paths, addresses and clock."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.world = rng.choice((8, 16, 32, 64, 128, 256, 512))
        self.rank = rng.randrange(self.world)
        self.local_rank = self.rank % 8
        self.node = self.rank // 8
        self.host = rng.choice(
            ("gpu-node-{:03d}", "dgx-a100-{:02d}", "h100-{:02d}", "node{}", "trainer-{}", "ip-10-42-{}-17")
        )
        self.host = self.host.format(self.node + rng.randint(0, 40))
        self.pid = rng.randint(1_000, 4_000_000)
        self.tid = self.pid + rng.randint(1, 900)
        self.python = rng.choice(("3.9", "3.10", "3.11", "3.12"))
        self.site = rng.choice(
            (
                f"/usr/local/lib/python{self.python}/dist-packages",
                f"/opt/conda/lib/python{self.python}/site-packages",
                f"/home/user/.venv/lib/python{self.python}/site-packages",
                f"/opt/venv/lib/python{self.python}/site-packages",
            )
        )
        self.clock = datetime(2025, 1, 1) + timedelta(seconds=rng.randrange(60 * 86400 * 12))
        self.nccl_version = rng.choice(("2.18.1", "2.19.3", "2.20.5", "2.21.5", "2.23.4", "2.26.2", "2.27.3"))
        self.cuda_dev = self.local_rank
        self.bus_id = rng.choice(("1b000", "29000", "3d000", "4f000", "9a000", "ab000", "ba000", "db000"))

    def tick(self, low: float = 0.01, high: float = 3.0) -> datetime:
        self.clock += timedelta(seconds=self.rng.uniform(low, high))
        return self.clock

    def glog(self, severity: str, source: str) -> str:
        """c10's glog header: `[E1130 02:54:48.068043558 ProcessGroupNCCL.cpp:1515] `."""
        t = self.tick()
        return f"[{severity}{t:%m%d %H:%M:%S}.{self.rng.randrange(10**9):09d} {source}:{self.rng.randint(100, 2300)}] "

    def pylog(self, severity: str, source: str) -> str:
        """torch's Python logging header: `W1130 02:54:18.606000 625 torch/distributed/run.py:851] `."""
        t = self.tick()
        return f"{severity}{t:%m%d %H:%M:%S}.{t.microsecond:06d} {self.pid} {source}:{self.rng.randint(100, 999)}] "

    def iso(self, millis: bool = True) -> str:
        t = self.tick()
        return f"{t:%Y-%m-%d %H:%M:%S}" + (f",{t.microsecond // 1000:03d}" if millis else "")

    def ip(self) -> str:
        return self.rng.choice(("10.{}.{}.{}", "192.168.{}.{}{}", "172.16.{}.{}{}")).format(
            *(self.rng.randint(0, 254) for _ in range(3))
        )

    def port(self) -> int:
        return self.rng.randint(20_000, 65_000)

    def other_host(self) -> str:
        return self.host.rstrip("0123456789") + str(self.rng.randint(0, 99))

    def nccl(self, level: str, message: str, source: str | None = None) -> str:
        """NCCL's debug line (src/debug.cc ncclDebugLog): `host:pid:tid [dev] NCCL INFO msg`, a WARN with the
        file and line before the level."""
        where = f"{source}:{self.rng.randint(40, 2400)} " if source else ""
        return f"{self.host}:{self.pid}:{self.tid} [{self.cuda_dev}] {where}NCCL {level} {message}"

    def frame(self, path: str, function: str, code: str) -> list[str]:
        return [f'  File "{path}", line {self.rng.randint(20, 2400)}, in {function}', f"    {code}"]

    def torch_path(self, module: str) -> str:
        return f"{self.site}/torch/{module}"


# --- Ordinary training output -------------------------------------------------------------------------------


def _omp_warning(v: Values) -> list[Line]:
    # torch/distributed/run.py: the agent's warning when OMP_NUM_THREADS is not set.
    head = v.pylog("W", "torch/distributed/run.py")
    stars = "*" * 49
    text = (
        "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system "
        "being overloaded, please further tune the variable for optimal performance in your application as needed. "
    )
    return [Line(head, AGENT), Line(head + stars, AGENT), Line(head + text, AGENT), Line(head + stars, AGENT)]


def _nccl_startup(v: Values) -> list[Line]:
    # NVIDIA/nccl src/init.cc, src/bootstrap.cc, src/transport/net_ib.cc: INFO lines of a healthy start.
    iface = v.rng.choice(("eth0", "ens5", "bond0", "ib0"))
    own = v.ip()
    lines = [
        v.nccl("INFO", f"Bootstrap : Using {iface}:{own}<0>"),
        v.nccl("INFO", "NET/Plugin: No plugin found (libnccl-net.so)"),
        v.nccl("INFO", f"NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB {iface}:{own}<0>"),
        v.nccl("INFO", "Using network IB"),
        v.nccl(
            "INFO",
            f"comm 0x{v.rng.getrandbits(44):x} rank {v.rank} nranks {v.world} cudaDev {v.cuda_dev} nvmlDev "
            f"{v.cuda_dev} busId {v.bus_id} commId 0x{v.rng.getrandbits(60):x} - Init START",
        ),
        v.nccl("INFO", f"Channel 00/{v.rng.choice((16, 24, 32))} :    0   1   2   3   4   5   6   7"),
        v.nccl("INFO", "Connected all rings"),
        v.nccl("INFO", "Connected all trees"),
        v.nccl(
            "INFO",
            f"comm 0x{v.rng.getrandbits(44):x} rank {v.rank} nranks {v.world} cudaDev {v.cuda_dev} nvmlDev "
            f"{v.cuda_dev} busId {v.bus_id} commId 0x{v.rng.getrandbits(60):x} - Init COMPLETE",
        ),
    ]
    return [Line(text) for text in lines[: v.rng.randint(3, len(lines))]]


def _python_warning(v: Values) -> list[Line]:
    # Lib/warnings.py: "%s:%s: %s: %s\n" then the source line, indented.
    path = v.torch_path("utils/checkpoint.py")
    return [
        Line(
            f"{path}:{v.rng.randint(80, 500)}: UserWarning: torch.utils.checkpoint: please pass in use_reentrant=True "
            "or use_reentrant=False explicitly. The default value of use_reentrant will be updated to be False in "
            "the future."
        ),
        Line("  warnings.warn("),
    ]


def _look_alikes(v: Values) -> list[Line]:
    """Healthy start-up lines that hold the words of failures (inf, nan, loss scale, failed, NET/IB): DeepSpeed's
    config print (deepspeed/runtime/config.py DeepSpeedConfig.print: "  {} {} {}" with dots), NCCL falling back
    from IB to sockets, Hugging Face's shard loading bar."""
    rng = v.rng
    head = f"[{v.iso()}] [INFO] [config.py:{rng.randint(900, 1000)}:print] "
    choices = [
        [
            Line(
                head
                + (
                    "  dynamic_loss_scale_args ...... {'init_scale': 65536, 'scale_window': 1000, "
                    "'delayed_shift': 2, 'consecutive_hysteresis': False, 'min_scale': 1}"
                )
            )
        ],
        [Line(head + "  loss_scale ................... 0"), Line(head + "  gradient_clipping ............ 1.0")],
        [
            Line(v.nccl("INFO", "NET/IB : No device found.")),
            Line(v.nccl("INFO", f"NET/Socket : Using [0]eth0:{v.ip()}<0>")),
        ],
        [
            Line(
                f"Loading checkpoint shards: 100%|##########| {k}/{k} [00:{rng.randint(10, 59)}<00:00,  "
                f"{rng.uniform(1, 9):.2f}s/it]"
            )
            for k in (rng.randint(2, 8),)
        ],
    ]
    return [line for group in rng.sample(choices, rng.randint(0, 2)) for line in group]


class Steps:
    """The step lines of one training style, with a loss that falls slowly and a stable loss scale."""

    STYLES = ("megatron", "hf", "lightning", "plain", "fairseq")

    def __init__(self, v: Values, style: str | None = None) -> None:
        self.v = v
        self.style = style or v.rng.choice(self.STYLES)
        self.step = v.rng.randint(1, 40) * v.rng.choice((1, 10, 100))
        self.loss = v.rng.uniform(2.0, 9.0)
        self.total = self.step + v.rng.randint(1_000, 500_000)
        self.scale = float(2 ** v.rng.randint(12, 17))
        self.every = v.rng.choice((1, 5, 10, 50, 100))

    def next(self) -> Line:
        v = self.v
        self.step += self.every
        self.loss *= v.rng.uniform(0.985, 1.004)
        grad_norm = v.rng.uniform(0.2, 3.0)
        lr = v.rng.uniform(1e-5, 3e-4)
        if self.style == "megatron":
            # NVIDIA/Megatron-LM megatron/training/training.py training_log.
            text = (
                f" [{v.iso(False)}] iteration {self.step:8d}/{self.total:8d} | consumed samples: "
                f"{self.step * 512:12d} | elapsed time per iteration (ms): {v.rng.uniform(300, 9000):.1f} | "
                f"learning rate: {lr:.6E} | global batch size: {512:5d} | lm loss: {self.loss:.6E} | "
                f"loss scale: {self.scale:.1f} | grad norm: {grad_norm:.3f} | number of skipped iterations: "
                f"{0:3d} | number of nan iterations: {0:3d} |"
            )
        elif self.style == "hf":
            # huggingface/transformers Trainer.log: the dict of metrics, printed.
            epoch = self.step / self.total * 3
            text = (
                f"{{'loss': {self.loss:.4f}, 'grad_norm': {grad_norm:.6f}, 'learning_rate': {lr:.4e}, 'epoch': "
                f"{epoch:.2f}}}"
            )
        elif self.style == "lightning":
            # tqdm's bar with Lightning's postfix, one rewrite per line as the reader splits them at CR.
            done = self.step % 1000
            text = (
                f"Epoch {self.step // 1000}:  {done // 10:2d}%|{'#' * (done // 100):<10}| {done}/1000 "
                f"[{done // 60:02d}:{done % 60:02d}<{(1000 - done) // 60:02d}:{(1000 - done) % 60:02d}, "
                f"{v.rng.uniform(1, 9):.2f}it/s, loss={self.loss:.3f}, v_num={v.rng.randint(0, 9)}]"
            )
        elif self.style == "fairseq":
            # fairseq/logging/progress_bar.py SimpleProgressBar.log: "{prefix}:  {i:5d} / {size:d} {stats}".
            text = (
                f"{v.iso(False)} | INFO | train_inner | epoch {1 + self.step // 5000:03d}:  {self.step % 5000:5d} "
                "/ 5000 "
                f"loss={self.loss:.3f}, nll_loss={self.loss * 0.8:.3f}, ppl={2 ** min(self.loss, 30):.2f}, "
                f"wps={v.rng.randint(5000, 90000)}, ups={v.rng.uniform(0.5, 4):.2f}, wpb={v.rng.randint(1000, 9000)}, "
                f"bsz={v.rng.choice((64, 128, 256))}, num_updates={self.step}, lr={lr:.4g}, gnorm={grad_norm:.3f}, "
                f"loss_scale={self.scale:g}, train_wall={v.rng.randint(10, 90)}, gb_free={v.rng.uniform(2, 60):.1f}, "
                f"wall={v.rng.randint(100, 90000)}"
            )
        else:
            text = f"step {self.step} | loss {self.loss:.4f} | lr {lr:.3e} | {v.rng.uniform(1e3, 5e5):.0f} tok/s"
        return Line(text)

    def lines(self, count: int) -> list[Line]:
        return [self.next() for _ in range(count)]


PHASES = ("launch", "startup", "init", "training")


def preamble(v: Values, steps: Steps, phase: str) -> list[Line]:
    """What a job prints before a failure of `phase`: nothing before the launcher starts a rank; the agent's
    and Python's warnings at start-up; NCCL's lines up to a communicator's start in its init; then steps."""
    rng = v.rng
    lines: list[Line] = []
    if phase == "launch":
        return lines
    if rng.random() < 0.5:
        lines += _omp_warning(v)
    if rng.random() < 0.4:
        lines += _python_warning(v)
    if phase == "startup":
        return lines
    if phase == "init":
        return lines + [
            line
            for line in _nccl_startup(v)
            if "Init START" not in line.text and "Connected" not in line.text and "Init COMPLETE" not in line.text
        ]
    if rng.random() < 0.6:
        lines += _nccl_startup(v)
    lines += _look_alikes(v)
    return lines + steps.lines(rng.randint(3, 25))


# --- The generic CUDA error and its cascade ----------------------------------------------------------------

GENERIC = ("an illegal memory access was encountered", "unspecified launch failure")
_CUDA_CODES = {
    "an illegal memory access was encountered": "cudaErrorIllegalAddress",
    "unspecified launch failure": "cudaErrorLaunchFailure",
}


def cuda_error_message(v: Values, error: str, exception: str = "RuntimeError") -> list[str]:
    """c10/cuda/CUDAException.cpp c10_cuda_check_implementation: "CUDA error: " + cudaGetErrorString, the
    help (newer releases), the asynchronous-report suffix, the device-side assertion line."""
    lines = [f"{exception}: CUDA error: {error}"]
    if v.rng.random() < 0.4:
        lines.append(
            f"Search for `{_CUDA_CODES[error]}' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
            "group__CUDART__TYPES.html for more information."
        )
    lines += [
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
        "incorrect.",
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
    ]
    return lines


def _c10_frames(v: Values, where: str) -> list[str]:
    """c10/util/Backtrace.cpp: the frames under "Exception raised from ...", as c10::Error prints them."""
    lib = f"{v.site}/torch/lib"
    calls = [
        ("c10::Error::Error(c10::SourceLocation, std::string)", "libc10.so"),
        ("c10::detail::torchCheckFail(char const*, char const*, unsigned int, std::string const&)", "libc10.so"),
        ("c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, bool)", "libc10_cuda.so"),
    ]
    if where == "watchdog":
        calls += [
            ("c10d::ProcessGroupNCCL::WorkNCCL::finishedGPUExecutionInternal() const", "libtorch_cuda.so"),
            ("c10d::ProcessGroupNCCL::WorkNCCL::isCompleted()", "libtorch_cuda.so"),
            ("c10d::ProcessGroupNCCL::watchdogHandler()", "libtorch_cuda.so"),
            ("c10d::ProcessGroupNCCL::ncclCommWatchdog()", "libtorch_cuda.so"),
        ]
    out = [
        f"frame #{i}: {call} + 0x{v.rng.randrange(16, 4096):x} (0x7f{v.rng.getrandbits(40):010x} in {lib}/{so})"
        for i, (call, so) in enumerate(calls)
    ]
    n = len(out)
    out += [
        f"frame #{n}: <unknown function> + 0xdc253 (0x7f{v.rng.getrandbits(40):010x} in "
        "/lib/x86_64-linux-gnu/libstdc++.so.6)",
        f"frame #{n + 1}: <unknown function> + 0x94ac3 (0x7f{v.rng.getrandbits(40):010x} in "
        "/lib/x86_64-linux-gnu/libc.so.6)",
    ]
    return out


def watchdog_cuda_error(v: Values, error: str) -> list[Line]:
    """ProcessGroupNCCL's watchdog (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, Watchdog::run): "{prefix}
    Process group watchdog thread terminated with exception: " + what(), then std::terminate's report."""
    pg = v.rng.choice(
        (
            "[PG ID 0 PG GUID 0(default_pg) Rank {r}]",
            "[PG 0 (default_pg) Rank {r}]",
            "[PG ID 2 PG GUID 9(EXPERT_PARALLEL_GROUP) Rank {r}]",
        )
    )
    pg = pg.format(r=v.rank if "default" in pg else v.rng.randrange(8))
    message = cuda_error_message(v, error)
    head = f"{pg} Process group watchdog thread terminated with exception: {message[0].split(': ', 1)[1]}"
    lines = [Line(v.glog("E", "ProcessGroupNCCL.cpp") + head)] + [Line(m) for m in message[1:]]
    lines.append(Line(""))
    lines.append(
        Line(
            "Exception raised from c10_cuda_check_implementation at /pytorch/c10/cuda/CUDAException.cpp:43 (most "
            "recent call first):"
        )
    )
    lines += [Line(f) for f in _c10_frames(v, "watchdog")]
    lines.append(Line(""))
    lines.append(Line("terminate called after throwing an instance of 'c10::DistBackendError'"))
    lines.append(Line(f"  what():  {head}"))
    return lines


def traceback_cuda_error(v: Values, error: str, frames: list[str] | None = None) -> list[Line]:
    """A Python traceback of the training loop ending in the CUDA error the next synchronising call raises."""
    exception = v.rng.choice(("RuntimeError", "RuntimeError", "torch.AcceleratorError"))
    body = ["Traceback (most recent call last):"]
    body += v.frame("/workspace/train.py", "<module>", "main()")
    body += v.frame("/workspace/train.py", "main", "loss = train_step(model, batch)")
    body += frames or v.frame("/workspace/train.py", "train_step", "return loss.item()")
    return [Line(text) for text in body + cuda_error_message(v, error, exception)]


def torchrun_report(v: Values, exitcode: int) -> list[Line]:
    """torchrun's agent (torch/distributed/elastic/multiprocessing/api.py and errors/__init__.py): the failed
    child and the ChildFailedError report."""
    pid = v.pid
    head = v.pylog("E", "torch/distributed/elastic/multiprocessing/api.py")
    lines = [f"{head}failed (exitcode: {exitcode}) local_rank: {v.local_rank} (pid: {pid}) of binary: /usr/bin/python3"]
    lines += ["Traceback (most recent call last):"]
    lines += v.frame("/usr/local/bin/torchrun", "<module>", "sys.exit(main())")
    lines += v.frame(v.torch_path("distributed/launcher/api.py"), "launch_agent", "raise ChildFailedError(")
    signal = {-6: "Signal 6 (SIGABRT) received by PID {}", -9: "Signal 9 (SIGKILL) received by PID {}"}
    lines += [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "=" * 60,
        "train.py FAILED",
        "-" * 60,
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "-" * 60,
        "Root Cause (first observed failure):",
        "[0]:",
        f"  time      : {v.clock:%Y-%m-%d_%H:%M:%S}",
        f"  host      : {v.host}",
        f"  rank      : {v.rank} (local_rank: {v.local_rank})",
        f"  exitcode  : {exitcode} (pid: {pid})",
        "  error_file: <N/A>",
        "  traceback : "
        + (
            signal[exitcode].format(pid)
            if exitcode in signal
            else "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
        ),
        "=" * 60,
    ]
    return [Line(text, AGENT) for text in lines]


def nccl_cuda_failure(v: Values, error: str) -> list[Line]:
    """NCCL meeting the broken context in its next call: src/include/checks.h CUDACHECK, WARN("Cuda failure '%s'",
    cudaGetErrorString(err)); torch raises it as DistBackendError (torch/csrc/distributed/c10d/NCCLUtils.hpp
    C10D_NCCL_CHECK: "NCCL error in: %s:%d, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL
    version %s" with getNcclErrorDetailStr's "ncclUnhandledCudaError: Call to CUDA function failed.")."""
    warn = v.nccl("WARN", f"Cuda failure '{error}'", v.rng.choice(("enqueue.cc", "proxy.cc", "transport/p2p.cc")))
    return [
        Line(warn),
        Line(
            "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:"
            f"{v.rng.randint(100, 400)}, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL "
            f"version {v.nccl_version}"
        ),
        Line("ncclUnhandledCudaError: Call to CUDA function failed."),
        Line("Last error:"),
        Line(f"Cuda failure '{error}'"),
    ]


def generic_cascade(v: Values, error: str | None = None) -> list[Line]:
    """The generic CUDA error a library's broken context raises afterwards, where it shows: the training loop's
    traceback, the watchdog's report, NCCL's next call, or two of them; then torchrun's report of the abort."""
    error = error or v.rng.choice(GENERIC)
    shape = v.rng.choice(("traceback", "watchdog", "both", "nccl"))
    lines: list[Line] = []
    if shape in ("traceback", "both"):
        lines += traceback_cuda_error(v, error)
    if shape in ("watchdog", "both"):
        lines += watchdog_cuda_error(v, error)
    if shape == "nccl":
        lines += nccl_cuda_failure(v, error)
    if v.rng.random() < 0.5:
        lines += torchrun_report(v, -6 if shape != "traceback" else 1)
    return lines


# --- Class 1: a library's own failure, then the generic error ----------------------------------------------


def _deepep_paths(v: Values) -> tuple[str, str]:
    """(DeepEP's build tree, its installed Python package) as __FILE__ and tracebacks show them."""
    root = v.rng.choice(("/workspace/DeepEP", "/opt/DeepEP", "/tmp/pip-req-build-x1y2z3", "/sgl-workspace/DeepEP"))
    return root, f"{v.site}/deep_ep"


def _deepep_traceback(v: Values, call: str, last: list[str]) -> list[Line]:
    """A traceback through a MoE layer into DeepEP's Buffer (deep_ep/buffer.py) ending in `last`."""
    _, package = _deepep_paths(v)
    body = ["Traceback (most recent call last):"]
    body += v.frame("/workspace/Megatron-LM/pretrain_gpt.py", "<module>", "pretrain(")
    body += v.frame(
        "/workspace/Megatron-LM/megatron/core/transformer/moe/token_dispatcher.py",
        "dispatch_preprocess",
        "hidden_states, dispatched_indices, dispatched_probs = fused_dispatch(",
    )
    body += v.frame(f"{package}/buffer.py", call, f"self.runtime.{call}(x, x_scales, topk_idx, topk_weights,")
    return [Line(text) for text in body + last]


# The printf each DeepEP kernel makes before it traps (csrc/kernels/intranode.cu, internode.cu, internode_ll.cu,
# utils.cuh), by the kernel and side that waited, with the values it prints. `rank` in them is the printing
# rank's own (its buffer rank); src_rank a peer's.
_KERNEL_PRINTF = {
    "dispatch_receivers": (
        "DeepEP timeout for dispatch receivers, rank %d, responsible_channel = %d, tokens remained: %d",
        lambda v, r: (v.rank, r.randrange(24), r.randint(1, 4096)),
    ),
    "dispatch_senders": (
        "DeepEP timeout for dispatch senders, rank %d, responsible_channel = %d",
        lambda v, r: (v.rank, r.randrange(24)),
    ),
    "combine_senders": (
        "DeepEP timeout for combine senders, rank %d, responsible_channel = %d",
        lambda v, r: (v.rank, r.randrange(24)),
    ),
    "forwarder": (
        "DeepEP dispatch forwarder timeout (RDMA meta), channel: %d, RDMA: %d, nvl: %d, src RDMA lane: %d, "
        "dst NVL: %d, meta: %d, %d, %d, %d",
        lambda v, r: (r.randrange(24), r.randrange(4), r.randrange(8), r.randrange(4), r.randrange(8), 0, 0, 0, 0),
    ),
    "rdma_sender": (
        "DeepEP dispatch RDMA sender timeout, channel: %d, RDMA: %d, nvl: %d, dst RDMA lane: %d, head: %d, tail: %d",
        lambda v, r: (r.randrange(24), r.randrange(4), r.randrange(8), r.randrange(4), r.randrange(512), 600),
    ),
    "barrier": (
        "DeepEP timeout check failed: rank = %d, thread = %d, value = %d)",
        lambda v, r: (v.local_rank, r.randrange(8), r.choice((0, 1, -1))),
    ),
    "notify": (
        "DeepEP notify (GPU reduction) timeout, rank: %d/%d, thread: %d, status: %d | %d, expected: %d",
        lambda v, r: (v.rank, v.world, r.randrange(32), r.randrange(8), r.randrange(8), v.world),
    ),
    "combine_receive": (
        "Warning: DeepEP timeout for combine receive, rank %d, local_expert_idx %d, src_rank %d",
        lambda v, r: (v.rank, r.randrange(32), r.randrange(v.world)),
    ),
}


def _kernel_timeouts(v: Values) -> tuple[str, list[str]]:
    """(shape, lines): a kernel's timeout printf, one per stuck thread or channel."""
    shape = v.rng.choice(sorted(_KERNEL_PRINTF))
    form, values = _KERNEL_PRINTF[shape]
    return shape, [form % values(v, v.rng) for _ in range(v.rng.randint(1, 6))]


def _deepep_kernel_timeout(v: Values) -> Failure:
    """A kernel's timeout printf and trap; the host then sees the launch failure (DeepEP's CUDA_CHECK wraps it
    in EPException: csrc/kernels/exception.cuh "Failed: CUDA error <file>:<line> '<error>'") or torch's
    check raises it; stdout (the printf) and stderr (the exception) interleave in either order."""
    shape, printed = _kernel_timeouts(v)
    root, _ = _deepep_paths(v)
    kernel_first = v.rng.random() < 0.75
    # The trap leaves cudaErrorLaunchFailure on this rank's context; an illegal memory access shows on the ranks
    # whose peer's NVLink-mapped buffer went away, reported later (a later line, the watchdog's report).
    error = v.rng.choice(GENERIC) if kernel_first else "unspecified launch failure"
    if v.rng.random() < 0.5:
        raised = [f"RuntimeError: Failed: CUDA error {root}/csrc/deep_ep.cpp:{v.rng.randint(200, 1600)} '{error}'"]
        host = _deepep_traceback(
            v, v.rng.choice(("intranode_dispatch", "internode_dispatch", "intranode_combine")), raised
        )
    else:
        host = traceback_cuda_error(v, error)
    kernel = [Line(text) for text in printed]
    lines = kernel + host if kernel_first else host + kernel
    if v.rng.random() < 0.4:
        lines += watchdog_cuda_error(v, error)
    peers = frozenset(int(n) for line in printed for n in re.findall(r"src_rank (\d+)", line))
    node_peers = frozenset(int(n) for line in printed for n in re.findall(r"thread = (\d+)", line))
    return Failure(f"deepep {shape}", lines, "deepep", own_error=True, peers=peers, node_peers=node_peers)


def _deepep_cpu_timeout(v: Values) -> Failure:
    """csrc/deep_ep.cpp Buffer::internode_dispatch: after NUM_CPU_TIMEOUT_SECS the host prints the counters it
    waited for ("Global rank: %d, num_recv_tokens: %d, num_rdma_recv_tokens: %d", "moe_recv_expert_counter[%d]:
    %d") and throws "DeepEP error: timeout (dispatch CPU)"; intranode_dispatch throws "DeepEP error: CPU recv
    timeout"."""
    rng = v.rng
    internode = rng.random() < 0.6
    lines: list[Line] = []
    if internode:
        lines.append(
            Line(
                f"Global rank: {v.rank}, num_recv_tokens: -1, num_rdma_recv_tokens: "
                f"{rng.choice((-1, rng.randint(0, 4096)))}"
            )
        )
        lines += [Line(f"moe_recv_expert_counter[{i}]: -1") for i in range(rng.choice((4, 8, 16)))]
    message = "DeepEP error: timeout (dispatch CPU)" if internode else "DeepEP error: CPU recv timeout"
    call = "internode_dispatch" if internode else "intranode_dispatch"
    lines += _deepep_traceback(v, call, [f"RuntimeError: {message}"])
    if v.rng.random() < 0.6:
        lines += generic_cascade(v)  # the kernel still spinning traps after the host gave up
    return Failure("deepep cpu timeout", lines, "deepep", own_error=True)


def _deepep_device_assert(v: Values) -> Failure:
    """csrc/kernels/exception.cuh EP_DEVICE_ASSERT: printf("Assertion failed: %s:%d, condition: %s\\n") then trap."""
    root, _ = _deepep_paths(v)
    kernel = v.rng.choice(("internode.cu", "intranode.cu", "internode_ll.cu"))
    condition = v.rng.choice(
        (
            "num_tokens_to_recv_from_rdma >= 0",
            "num_max_nvl_chunked_recv_tokens % num_nvl_ranks == 0",
            "dst_rdma_rank < kNumRDMARanks",
            "num_recv_tokens >= 0",
        )
    )
    printed = [
        Line(f"Assertion failed: {root}/csrc/kernels/{kernel}:{v.rng.randint(100, 2200)}, condition: {condition}")
        for _ in range(v.rng.randint(1, 4))
    ]
    return Failure(
        "deepep device assertion",
        printed + traceback_cuda_error(v, "unspecified launch failure"),
        "deepep",
        own_error=True,
    )


def _nvshmem_ibgda(v: Values) -> Failure:
    """NVSHMEM's IBGDA device code (src/include/device_host_transport/nvshmem_common_ibgda.h, ibgda_device.cuh):
    "[%d] ibgda_poll_cq timeout:" with the queue's counters, or "[%d] got completion with err:" with the CQE's
    syndromes, printed by the PE (the rank) before the kernel stops."""
    rng = v.rng
    pe = v.rank
    if rng.random() < 0.5:
        printed = [
            f"[{pe}] ibgda_poll_cq timeout:",
            f"    cons_idx={rng.randrange(1 << 16):#x}, prod_idx={rng.randrange(1 << 16):#x}, "
            f"cqn={rng.randrange(1 << 12):#x}, qpn={rng.randrange(1 << 16):#x}, opcode={rng.randrange(16):#x}",
            f"    wqe_counter={rng.randrange(1 << 16):#x}, resv_head={rng.randrange(1 << 16):#x}, "
            f"ready_head={rng.randrange(1 << 16):#x}",
            f"    while waiting for idx={rng.randrange(1 << 16):#x}.",
        ]
        shape = "nvshmem ibgda poll timeout"
    else:
        printed = [
            f"[{pe}] got completion with err:",
            f"   syndrome={rng.choice((0x5, 0x15, 0x22)):#x}, vendor_err_synd={rng.randrange(256):#x}, "
            f"hw_err_synd={rng.randrange(256):#x}, hw_synd_type={rng.randrange(4):#x},",
            f"   wqe_counter={rng.randrange(1 << 16):#x}, s_wqe_opcode_qpn={rng.randrange(1 << 24):#x},",
            f"   cqn={rng.randrange(1 << 12):#x}, cons_idx={rng.randrange(1 << 16):#x}, "
            f"prod_idx={rng.randrange(1 << 16):#x}, idx={rng.randrange(1 << 16):#x}",
        ]
        shape = "nvshmem ibgda completion error"
    lines = [Line(text) for text in printed]
    return Failure(shape, lines + traceback_cuda_error(v, rng.choice(GENERIC)), "deepep", own_error=True)


def _nccl_transport_then_generic(v: Values) -> Failure:
    """NCCL's own transport error (src/transport/net_ib.cc ncclIbTest: "NET/IB : Got completion from peer %s with
    status=%d opcode=%d len=%d vendor err %d (%s)", ncclIbLogCompletionWithError in newer releases), then the
    generic error a later CUDA call returns."""
    peer = f"{v.ip()}<{v.port()}>"
    status = v.rng.choice((12, 13, 10, 4))
    warn = v.nccl(
        "WARN",
        f"NET/IB : Got completion from peer {peer} with status={status} opcode={v.rng.randrange(3)} "
        f"len={v.rng.randrange(1 << 20)} "
        f"vendor err {v.rng.randint(100, 250)} (Send) localGid ::ffff:{v.ip()} remoteGids ::ffff:{v.ip()} hca "
        f"mlx5_{v.rng.randrange(8)}",
        "transport/net_ib.cc",
    )
    trail = [
        v.nccl("INFO", f"transport/net_ib.cc:{v.rng.randint(1000, 2400)} -> 6"),
        v.nccl("INFO", f"transport/net.cc:{v.rng.randint(1000, 1400)} -> 6"),
    ]
    lines = [Line(warn)] + [Line(t) for t in trail] + generic_cascade(v)
    return Failure("nccl ib completion error", lines, "nccl_transport", own_error=True)


def _nccl_timeout_then_generic(v: Values) -> Failure:
    """ProcessGroupNCCL's watchdog timeout (WorkNCCL::checkTimeout: "Watchdog caught collective operation timeout:
    WorkNCCL(SeqNum=%d, OpType=%s, NumelIn=%d, NumelOut=%d, Timeout(ms)=%d) ran for %d milliseconds before timing
    out."); the communicator is aborted under the running kernel and a later CUDA call returns the generic error."""
    seq = v.rng.randint(2, 90_000)
    op = v.rng.choice(("ALLREDUCE", "_ALLGATHER_BASE", "_REDUCE_SCATTER_BASE", "ALLTOALL_BASE", "BROADCAST"))
    numel = v.rng.choice((1, 4096, 1048576, 33554432))
    timeout = v.rng.choice((600000, 1800000, 300000))
    pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {v.rank}]"
    text = (
        f"{pg} Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, "
        f"NumelOut={numel}, Timeout(ms)={timeout}) ran for {timeout + v.rng.randint(1, 900)} milliseconds before "
        "timing out."
    )
    lines = [Line(v.glog("E", "ProcessGroupNCCL.cpp") + text)]
    lines += watchdog_cuda_error(v, v.rng.choice(GENERIC))
    return Failure("nccl watchdog timeout", lines, "nccl_timeout", own_error=True)


# --- Class 2: non-finite values without a keyword ----------------------------------------------------------


def _csv_rows(v: Values) -> Failure:
    rng = v.rng
    names = ["step"] + rng.sample(
        ["loss", "val_loss", "acc", "ppl", "lr", "kl", "reward", "entropy"], rng.randint(2, 6)
    )
    rows = [",".join(names)]
    step = rng.randint(0, 5000)
    for _ in range(rng.randint(3, 20)):
        step += 1
        rows.append(",".join([str(step)] + [f"{rng.uniform(0.01, 9):.{rng.randint(2, 6)}f}" for _ in names[1:]]))
    for _ in range(rng.randint(1, 6)):
        step += 1
        cells = [f"{rng.uniform(0.01, 9):.4f}" for _ in names[1:]]
        for index in rng.sample(range(len(cells)), rng.randint(1, len(cells))):
            cells[index] = rng.choice(("nan", "nan", "NaN", "inf", "-inf"))
        rows.append(",".join([str(step)] + cells))
    return Failure("csv rows", [Line(row) for row in rows], "nan_inf")


def _step_values(v: Values) -> Failure:
    """`print(step, loss)`: "77010 2.3456" lines, then the value goes nan."""
    rng = v.rng
    step = rng.randint(10, 90_000)
    every = rng.choice((1, 10, 100))
    lines = []
    for _ in range(rng.randint(3, 20)):
        step += every
        lines.append(f"{step} {rng.uniform(0.5, 6):.{rng.randint(3, 6)}f}")
    for _ in range(rng.randint(1, 6)):
        step += every
        lines.append(f"{step} {rng.choice(('nan', 'nan', 'nan nan', 'inf'))}")
    return Failure("step values", [Line(text) for text in lines], "nan_inf")


def _verl_not_finite(v: Values) -> Failure:
    """volcengine/verl workers/actor/dp_actor.py: print(f"WARN: rank {rank} grad_norm is not finite: {grad_norm}")
    (older: "WARN: grad_norm is not finite: ..."), then its metric lines "step:%d - key:value - ..." holding nan."""
    rng = v.rng
    lines = []
    step = rng.randint(1, 400)
    for _ in range(rng.randint(2, 8)):
        step += 1
        lines.append(
            f"step:{step} - actor/pg_loss:{rng.uniform(-0.1, 0.1):.3f} - "
            f"actor/grad_norm:{rng.uniform(0.1, 2):.3f} - critic/score/mean:{rng.uniform(0, 1):.3f} - "
            f"perf/mfu/actor:{rng.uniform(0.1, 0.5):.3f}"
        )
    value = rng.choice(("nan", "inf", "tensor(nan, device='cuda:0')", f"tensor(inf, device='cuda:{v.local_rank}')"))
    who = f"rank {v.rank} " if rng.random() < 0.6 else ""
    lines += [f"WARN: {who}grad_norm is not finite: {value}"] * rng.randint(1, 3)
    if rng.random() < 0.5:
        step += 1
        lines.append(
            f"step:{step} - actor/pg_loss:nan - actor/grad_norm:nan - critic/score/mean:{rng.uniform(0, 1):.3f} - "
            f"perf/mfu/actor:{rng.uniform(0.1, 0.5):.3f}"
        )
    return Failure("verl grad_norm not finite", [Line(text) for text in lines], "nan_inf")


def _fairseq_overflow(v: Values) -> Failure:
    """fairseq/trainer.py: logger.info(f"NOTE: gradient overflow detected, ignoring gradient, {str(e)}") with the
    OverflowError of fairseq/optim/dynamic_loss_scaler.py ("setting loss scale to: " + str(loss_scale)), halving
    report after report; the train_inner lines (JSON progress bar) carry "loss_scale"."""
    rng = v.rng
    scale = float(2 ** rng.randint(4, 9))
    lines = []
    update = rng.randint(1, 300)
    for _ in range(rng.randint(4, 12)):
        if rng.random() < 0.3:
            update += 1
            lines.append(
                f'{v.iso(False)} | INFO | train_inner | {{"epoch": 1, "update": {update / 10000:.3f}, '
                f'"loss": "{rng.uniform(8, 20):.3f}", "ppl": "{rng.uniform(1e3, 1e7):.6g}", '
                f'"wps": "{rng.uniform(100, 9000):.1f}", "num_updates": "{update}", '
                f'"lr": "{rng.uniform(1e-5, 5e-4):.4g}", "gnorm": "{rng.uniform(1, 50):.3f}", '
                f'"loss_scale": "{scale:g}", "wall": "{rng.randint(60, 9000)}"}}'
            )
        scale /= 2
        lines.append(
            f"{v.iso(False)} | INFO | fairseq.trainer | NOTE: gradient overflow detected, ignoring gradient, "
            f"setting loss scale to: {scale}"
        )
    return Failure("fairseq loss scale halving", [Line(text) for text in lines], "nan_inf")


def _dllogger_scale(v: Values) -> Failure:
    """NVIDIA/dllogger StdOutBackend.log: "DLL {timestamp} - {step} {metric : value unit}..." with the loss
    scale apex's dynamic scaler halves at every overflow, to the end of the log."""
    rng = v.rng
    scale = float(2 ** rng.randint(12, 16))
    epoch, iteration = rng.randint(0, 3), rng.randint(0, 500)
    lines = []
    for k in range(rng.randint(6, 16)):
        iteration += rng.choice((1, 10))
        if k >= 2:
            scale /= 2
        when = v.tick()
        lines.append(
            f"DLL {when:%Y-%m-%d %H:%M:%S}.{when.microsecond:06d} - Training Epoch: {epoch} Training Iteration: "
            f"{iteration}  "
            f"step_loss : {rng.uniform(5, 12):.4f}  learning_rate : {rng.uniform(1e-5, 1e-3):.6g}  loss_scale : "
            f"{scale} "
        )
    return Failure("dllogger loss scale halving", [Line(text) for text in lines], "nan_inf")


def _megatron_scale_halving(v: Values) -> Failure:
    """NVIDIA/Megatron-LM training_log: the iteration line's "loss scale: {:.1f}" halves at every report while
    "number of skipped iterations" counts the steps the overflow skipped, to the end of the log."""
    rng = v.rng
    steps = Steps(v, "megatron")
    lines = []
    for _ in range(rng.randint(4, 10)):
        steps.scale /= 2
        line = steps.next().text
        skipped = steps.every if steps.every < 100 else rng.randint(20, 100)
        lines.append(line.replace("number of skipped iterations:   0", f"number of skipped iterations: {skipped:3d}"))
    return Failure("megatron loss scale halving", [Line(text) for text in lines], "nan_inf")


def _tensor_at_stop(v: Values) -> Failure:
    """A tensor printed (torch/_tensor_str.py) where the log stops, holding nan or -inf among its values."""
    rng = v.rng
    bad = rng.choice(("nan", "-inf", "inf"))
    rows = []
    for r in range(rng.randint(1, 4)):
        cells = [f"{rng.uniform(-3, 3):8.4f}" for _ in range(rng.randint(3, 6))]
        if r == 0 or rng.random() < 0.5:
            cells[rng.randrange(len(cells))] = f"{bad:>8}"
        rows.append(", ".join(cells))
    body = [f"tensor([[{rows[0]}],"] + [f"        [{row}]," for row in rows[1:]]
    body[-1] = body[-1].rstrip(",") + f"], device='cuda:{v.local_rank}', dtype=torch.bfloat16)"
    label = rng.choice(("logits:", "hidden_states after layer 12:", "attn_output"))
    return Failure("tensor at stop", [Line(label)] + [Line(text) for text in body], "nan_inf")


# --- Class 3: a kill that other launchers report -----------------------------------------------------------


def _mpirun_killed(v: Values) -> Failure:
    """Open MPI's help-errmgr-base.txt / PRRTE's help-prun.txt: "%s noticed that process rank %lu with PID %lu on
    node %s exited on signal %d (%s).", between rules of dashes, after the "Primary job terminated normally" note."""
    dashes = "-" * 74
    lines = []
    if v.rng.random() < 0.6:
        lines += [
            dashes,
            "Primary job  terminated normally, but 1 process returned",
            "a non-zero exit code. Per user-direction, the job has been aborted.",
            dashes,
        ]
    strsignal = v.rng.random() < 0.8
    tail = " (Killed)." if strsignal else "."
    lines += [
        dashes,
        f"mpirun noticed that process rank {v.rank} with PID {v.pid} on node {v.host} exited on signal 9{tail}",
        dashes,
    ]
    return Failure("mpirun signal 9", [Line(text, LAUNCHER) for text in lines], "host_oom")


def _glued_killed(v: Values) -> Failure:
    """bash's job report `Killed` printed where tqdm left its cursor (after a carriage return, no newline)."""
    rng = v.rng
    total = rng.choice((3, 100, 1000, 5000))
    done = rng.randrange(1, total)
    label = rng.choice(("Loading checkpoint shards", "Epoch 1", "Map", "Tokenizing", ""))
    head = f"{label}: " if label else ""
    bar = (
        f"{head}{100 * done // total:3d}%|{'#' * (10 * done // total):<10}| {done}/{total} "
        f"[{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}<{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}, "
        f"{rng.uniform(0.1, 30):.2f}it/s]"
    )
    return Failure("killed glued to a progress bar", [Line(bar + "Killed", LAUNCHER)], "host_oom")


def _deepspeed_return_code(v: Values) -> Failure:
    """deepspeedai/DeepSpeed deepspeed/launcher/launch.py sigkill_handler: logger.info(f"Killing subprocess
    {pid}") for each child, then logger.error(f"{cmd} exits with return code = {returncode}")."""

    def header(level: str) -> str:
        return f"[{v.iso()}] [{level}] [launch.py:{v.rng.randint(140, 340)}:sigkill_handler] "

    lines = [header("INFO") + f"Killing subprocess {v.pid + k}" for k in range(v.rng.randint(1, 8))]
    cmd = (
        f"['/usr/bin/python3', '-u', 'train.py', '--local_rank={v.local_rank}', '--deepspeed', "
        "'--deepspeed_config', 'ds_config.json']"
    )
    lines.append(header("ERROR") + f"{cmd} exits with return code = -9")
    return Failure("deepspeed return code -9", [Line(text, AGENT) for text in lines], "host_oom")


# --- Class 4: NCCL's connection lines where the log ends on them -------------------------------------------


def _connect_retries(v: Values, count: int) -> tuple[str, list[str]]:
    """src/misc/socket.cc socketConnectCheck: INFO "%s: connect to %s returned %s, retrying (%d/%ld) after sleep for
    %u msec" (funcName socketStartConnect or socketPollConnect; the address as ncclSocketToString "ip<port>");
    releases before 2.19: INFO "Call to connect returned %s, retrying"."""
    peer = f"{v.ip()}<{v.port()}>"
    reason = v.rng.choice(("Connection refused", "No route to host", "Connection timed out"))
    if v.rng.random() < 0.25:
        return peer, [v.nccl("INFO", f"Call to connect returned {reason}, retrying") for _ in range(count)]
    func = v.rng.choice(("socketStartConnect", "socketPollConnect"))
    return peer, [
        v.nccl("INFO", f"{func}: connect to {peer} returned {reason}, retrying ({k}/34) after sleep for {k * 100} msec")
        for k in range(1, count + 1)
    ]


def _nccl_retrying(v: Values) -> Failure:
    _, lines = _connect_retries(v, v.rng.randint(2, 12))
    return Failure("nccl connect retrying", [Line(text) for text in lines], "nccl_transport")


def _nccl_retries_exceeded(v: Values) -> Failure:
    """socketConnectCheck: WARN "%s: connect to %s returned %s, exceeded error retry count after %d attempts",
    then the NCCLCHECK trail (src/include/checks.h INFO "%s:%d -> %d")."""
    peer, lines = _connect_retries(v, v.rng.randint(0, 6))
    reason = v.rng.choice(("Connection refused", "No route to host", "Connection timed out"))
    func = v.rng.choice(("socketStartConnect", "socketPollConnect"))
    lines.append(
        v.nccl(
            "WARN",
            f"{func}: connect to {peer} returned {reason}, exceeded error retry count after 35 attempts",
            "misc/socket.cc",
        )
    )
    lines += [
        v.nccl("INFO", f"{where}:{v.rng.randint(100, 1500)} -> 6")
        for where in ("misc/socket.cc", "bootstrap.cc")[: v.rng.randint(0, 2)]
    ]
    return Failure("nccl connect retries exceeded", [Line(text) for text in lines], "nccl_transport", own_error=True)


def _mlx5_completion_error(v: Values) -> Failure:
    """linux-rdma/rdma-core providers/mlx5/cq.c mlx5_parse_cqe: PFX "%s: got completion with error:\\n" (PFX is
    "mlx5: ", %s the host name) and dump_cqe's four words a line; NCCL's own report may follow."""
    rng = v.rng
    lines = [f"mlx5: {v.host}: got completion with error:"]
    lines += [" ".join(f"{rng.getrandbits(32) if rng.random() < 0.3 else 0:08x}" for _ in range(4)) for _ in range(4)]
    if rng.random() < 0.5:
        lines.append(
            v.nccl(
                "WARN",
                f"NET/IB : Got completion from peer {v.ip()}<{v.port()}> with status=4 opcode=0 len=0 vendor err "
                f"81 (Recv) hca mlx5_{rng.randrange(8)}",
                "transport/net_ib.cc",
            )
        )
    return Failure("mlx5 completion error", [Line(text) for text in lines], "nccl_transport", own_error=True)


def _net_ib_failed(v: Values) -> Failure:
    """src/transport/net_ib.cc: WARN "NET/IB : Unable to query port %d" (ncclIbInit skips the port and goes on),
    "NET/IB: %s: mlx5dv_create_qp failed to create QP: %m" (ncclIbCreateQpMlx5 returns ncclInternalError),
    "NET/IB : %s:%d Got async event : %s" (ncclIbAsyncThreadMain). The two last are NCCL's own errors."""
    device = f"mlx5_{v.rng.randrange(8)}"
    message, own = v.rng.choice(
        (
            (f"NET/IB : Unable to query port {v.rng.randint(1, 2)}", False),
            ("NET/IB: ncclIbCreateQpMlx5: mlx5dv_create_qp failed to create QP: Cannot allocate memory", True),
            (f"NET/IB : {device}:1 Got async event : port error", True),
        )
    )
    lines = [v.nccl("WARN", message, "transport/net_ib.cc")]
    lines += [v.nccl("INFO", f"transport/net_ib.cc:{v.rng.randint(100, 2400)} -> 2")] * v.rng.randint(0, 2)
    return Failure("nccl net/ib failed", [Line(text) for text in lines], "nccl_transport", own_error=own)


# --- Class 5: rendezvous beyond TCPStore's own messages ----------------------------------------------------


def _host_unresolvable(v: Values) -> Failure:
    """torch/csrc/distributed/c10d/socket.cpp SocketConnectOp::tryConnect: recordError("The {}network addresses of
    ({}, {}) cannot be retrieved (gai error: {} - {}).") logged as a warning at each retry; in the end the client
    socket times out ("The client socket has timed out after {} while trying to connect to ({}, {}).")."""
    host = v.rng.choice(("master-0", "trainer-0.trainer-headless", "node-000", f"{v.host}.cluster.local"))
    port = v.rng.choice((29500, 29400, 23456, v.port()))
    gai = v.rng.choice(
        (
            "-2 - Name or service not known",
            "-3 - Temporary failure in name resolution",
            "-5 - No address associated with hostname",
        )
    )
    family = v.rng.choice(("", "IPv4 ", "IPv6 "))
    header = v.rng.choice(("glog", "short"))
    lines = []
    for _ in range(v.rng.randint(1, 8)):
        head = v.glog("W", "socket.cpp") if header == "glog" else f"[W socket.cpp:{v.rng.randint(400, 760)}] "
        lines.append(
            f"{head}[c10d] The {family}network addresses of ({host}, {port}) cannot be retrieved (gai error: {gai})."
        )
    if v.rng.random() < 0.5:
        lines += ["Traceback (most recent call last):"]
        lines += v.frame("/workspace/train.py", "<module>", 'dist.init_process_group("nccl")')
        lines += v.frame(v.torch_path("distributed/rendezvous.py"), "_create_c10d_store", "return TCPStore(")
        lines.append(
            "torch.distributed.DistNetworkError: The client socket has timed out after 1800s while trying to "
            f"connect to ({host}, {port})."
        )
    return Failure("host name unresolvable (c10d)", [Line(text) for text in lines], "rendezvous")


def _nccl_host_unresolvable(v: Values) -> Failure:
    """NVIDIA/nccl src/misc/socket.cc ncclSocketGetAddrFromString: WARN "Net : error encountered when getting address
    info : %s" (gai_strerror), then the NCCLCHECK trail and torch's DistBackendError."""
    reason = v.rng.choice(("Name or service not known", "Temporary failure in name resolution"))
    lines = [v.nccl("WARN", f"Net : error encountered when getting address info : {reason}", "misc/socket.cc")]
    lines += [
        v.nccl("INFO", f"{where}:{v.rng.randint(100, 1500)} -> 3")
        for where in ("misc/socket.cc", "bootstrap.cc", "init.cc")
    ]
    if v.rng.random() < 0.6:
        lines.append(
            "torch.distributed.DistBackendError: NCCL error in: "
            "/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:"
            f"{v.rng.randint(1500, 3500)}, internal error - please report this issue to the NCCL developers, NCCL "
            f"version {v.nccl_version}"
        )
    return Failure("host name unresolvable (nccl)", [Line(text) for text in lines], "rendezvous")


def _store_wait_in_framework(v: Values) -> Failure:
    """A store wait in framework code times out: TCPStore::doWait C10_THROW_ERROR(DistStoreError, "wait timeout
    after {}ms, keys: {}") (libuv backend), or the older "Socket Timeout"."""
    timeout = v.rng.choice((300000, 600000, 1800000))
    key = v.rng.choice(
        ("/worker/attempt_0/ready", "rdzv/ready_0", "server_ready", f"/default_pg/{v.rng.randrange(9)}//cuda//0")
    )
    framework = v.rng.choice(
        (
            (f"{v.site}/verl/single_controller/base/worker.py", "wait_for_input", "self._store.wait([key])"),
            (f"{v.site}/lightning/fabric/utilities/distributed.py", "_sync_ready", "store.get(key)"),
            ("/workspace/src/launcher/coordination.py", "wait_for_input", "value = self.store.get(self.key)"),
        )
    )
    lines = ["Traceback (most recent call last):"]
    lines += v.frame("/workspace/train.py", "<module>", "main()")
    lines += v.frame(framework[0], framework[1], framework[2])
    error = v.rng.choice((f"wait timeout after {timeout}ms, keys: {key}", "Socket Timeout"))
    lines.append(f"torch.distributed.DistStoreError: {error}")
    return Failure("store wait timed out in framework code", [Line(text) for text in lines], "rendezvous")


def _gloo_full_mesh(v: Values) -> Failure:
    """torch/csrc/distributed/c10d/ProcessGroupGloo.cpp: "Gloo connectFullMesh failed with " + the exception of
    gloo/transport/tcp/pair.cc ("[%s:%d] " + its message)."""
    pair = v.rng.choice(
        (
            "../third_party/gloo/gloo/transport/tcp/pair.cc",
            "/opt/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc",
        )
    )
    message = v.rng.choice(
        (
            f"[{pair}:152] timed out connecting: SO_ERROR: Connection refused, remote=[{v.ip()}]:{v.port()}, "
            f"rank={v.rank}, size={v.world}",
            f"[{pair}:144] no error",
            f"[{pair}:799] connect [{v.ip()}]:{v.port()}: Connection refused",
        )
    )
    lines = ["Traceback (most recent call last):"]
    lines += v.frame("/workspace/train.py", "<module>", 'group = dist.new_group(backend="gloo")')
    lines += v.frame(
        v.torch_path("distributed/distributed_c10d.py"),
        "_new_process_group_helper",
        "backend_class = ProcessGroupGloo(",
    )
    lines.append(f"RuntimeError: Gloo connectFullMesh failed with {message}")
    return Failure("gloo connectFullMesh", [Line(text) for text in lines], "rendezvous")


def _elastic_rendezvous(v: Values) -> Failure:
    """torch/distributed/elastic/rendezvous/dynamic_rendezvous.py: RendezvousTimeoutError raised by the agent's
    next_rendezvous, or RendezvousClosedError."""
    error = v.rng.choice(
        (
            "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError",
            "torch.distributed.elastic.rendezvous.api.RendezvousClosedError",
        )
    )
    lines = ["Traceback (most recent call last):"]
    lines += v.frame("/usr/local/bin/torchrun", "<module>", "sys.exit(main())")
    lines += v.frame(
        v.torch_path("distributed/elastic/agent/server/api.py"),
        "_rendezvous",
        "rdzv_info = spec.rdzv_handler.next_rendezvous()",
    )
    lines += v.frame(
        v.torch_path("distributed/elastic/rendezvous/dynamic_rendezvous.py"),
        "next_rendezvous",
        "self._op_executor.run(join_op, deadline, self._get_deadline)",
    )
    lines.append(error)
    return Failure("torch elastic rendezvous", [Line(text, AGENT) for text in lines], "rendezvous")


# --- Class 6: tracebacks known by their frames and exception -----------------------------------------------


def _deepspeed_ssh_check(v: Values) -> Failure:
    """deepspeedai/DeepSpeed deepspeed/launcher/runner.py main: the ssh check of the hostfile's first host
    (subprocess.check_call of "ssh -o PasswordAuthentication=no [-p N] host hostname", re-raised as RuntimeError
    "Using hostfile at {} but host={} was not reachable via ssh. ..."), or the master address probe
    (check_output of ssh host hostname -I: the CalledProcessError itself after logger.error)."""
    host = v.other_host()
    runner = f"{v.site}/deepspeed/launcher/runner.py"
    lines = ["Traceback (most recent call last):"]
    lines += v.frame("/usr/local/bin/deepspeed", "<module>", "main()")
    if v.rng.random() < 0.5:
        port = f"-p {v.rng.choice((22, 2222))} " if v.rng.random() < 0.5 else ""
        lines += v.frame(
            runner, "main", "subprocess.check_call(safe_ssh_cmd, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)"
        )
        lines += v.frame(
            f"/usr/lib/python{v.python}/subprocess.py", "check_call", "raise CalledProcessError(retcode, cmd)"
        )
        args = ["ssh", "-o", "PasswordAuthentication=no"] + port.split() + [host, "hostname"]
        lines.append(f"subprocess.CalledProcessError: Command '{args}' returned non-zero exit status 255.")
        lines += [
            "",
            "During handling of the above exception, another exception occurred:",
            "",
            "Traceback (most recent call last):",
        ]
        lines += v.frame("/usr/local/bin/deepspeed", "<module>", "main()")
        lines += v.frame(runner, "main", "raise RuntimeError(")
        lines.append(
            f"RuntimeError: Using hostfile at /job/hostfile but host={host} was not reachable via ssh. If you are "
            "running with "
            "a single node please remove /job/hostfile or setup passwordless ssh."
        )
    else:
        pre = [
            f"[{v.iso()}] [ERROR] [runner.py:{v.rng.randint(400, 600)}:main] Unable to detect suitable master "
            "address via `hostname -I`, please manually specify one via --master_addr"
        ]
        lines = pre + lines
        lines += v.frame(runner, "main", "result = subprocess.check_output(hostname_cmd)")
        lines += v.frame(
            f"/usr/lib/python{v.python}/subprocess.py", "run", "raise CalledProcessError(retcode, process.args,"
        )
        lines.append(
            f"subprocess.CalledProcessError: Command '['ssh', '{host}', 'hostname', '-I']' returned non-zero exit "
            "status 255."
        )
    return Failure("deepspeed ssh check", [Line(text, LAUNCHER) for text in lines], "environment")


def _cublas_execution_failed(v: Values) -> Failure:
    """aten/src/ATen/cuda/CUDABlas.cpp TORCH_CUDABLAS_CHECK: "CUDA error: %s when calling `%s`" with
    CUBLAS_STATUS_EXECUTION_FAILED (status 13); DeepSpeed's csrc/transformer/cublas_wrappers.cu: "!!!! kernel
    execution error. (m: %d, n: %d, k: %d, error: %d)"."""
    m, n, k = (v.rng.choice((1024, 2048, 4096, 8192, 14336)) for _ in range(3))
    if v.rng.random() < 0.4:
        lines = [f"!!!! kernel execution error. (m: {m}, n: {n}, k: {k}, error: 13)"] * v.rng.randint(1, 4)
        return Failure("deepspeed cublas status 13", [Line(text) for text in lines], "gpu_fault")
    call = v.rng.choice(
        (
            "cublasGemmEx( handle, opa, opb, m, n, k, &falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &fbeta, "
            "c, CUDA_R_16BF, ldc, compute_type, CUBLAS_GEMM_DEFAULT_TENSOR_OP)",
            "cublasGemmStridedBatchedEx(handle, opa, opb, (int)m, (int)n, (int)k, (void*)&falpha, a, CUDA_R_16F, "
            "(int)lda, stridea, b, CUDA_R_16F, (int)ldb, strideb, (void*)&fbeta, c, CUDA_R_16F, (int)ldc, "
            "stridec, (int)num_batches, compute_type, CUBLAS_GEMM_DEFAULT_TENSOR_OP)",
            "cublasLtMatmul( ltHandle, computeDesc.descriptor(), &alpha_val, mat1_ptr, Adesc.descriptor(), "
            "mat2_ptr, Bdesc.descriptor(), &beta_val, result_ptr, Cdesc.descriptor(), result_ptr, "
            "Cdesc.descriptor(), &heuristicResult.algo, workspace.mutable_data_ptr(), workspaceSize, "
            "at::cuda::getCurrentCUDAStream())",
        )
    )
    lines = ["Traceback (most recent call last):"]
    lines += v.frame("/workspace/train.py", "<module>", "loss = model(batch).loss")
    lines += v.frame(v.torch_path("nn/modules/linear.py"), "forward", "return F.linear(input, self.weight, self.bias)")
    lines.append(f"RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `{call}`")
    return Failure("cublas execution failed", [Line(text) for text in lines], "gpu_fault")


def _duplicate_gpu(v: Values) -> Failure:
    """NVIDIA/nccl src/init.cc initTransportsRank: WARN "Duplicate GPU detected : rank %d and rank %d both on CUDA
    device %lx"; torch raises DistBackendError "NCCL error in: ..., invalid usage (run with NCCL_DEBUG=WARN for
    details), NCCL version ..." with NCCL's last error."""
    other = (v.rank + 1) % v.world
    warn = f"Duplicate GPU detected : rank {v.rank} and rank {other} both on CUDA device {v.bus_id}"
    lines = [v.nccl("WARN", warn, "init.cc"), v.nccl("INFO", f"init.cc:{v.rng.randint(1000, 1800)} -> 5")]
    lines += [
        f"torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:"
        f"{v.rng.randint(1500, 3500)}, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version "
        f"{v.nccl_version}",
        "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
        "Last error:",
        warn,
    ]
    return Failure(
        "duplicate gpu",
        [Line(text) for text in lines],
        "environment",
        frozenset({"nccl_transport", "environment", "usage"}),
    )


# --- The classes -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Writer:
    """A writer of a class's failures, the phases of a job it can fail in, and the training styles around it."""

    write: Callable[[Values], Failure]
    phases: tuple[str, ...] = ("training",)
    styles: tuple[str, ...] = Steps.STYLES


WRITERS = {
    "cascade": (
        Writer(_deepep_kernel_timeout, styles=("megatron", "plain")),
        Writer(_deepep_kernel_timeout, styles=("megatron", "plain")),
        Writer(_deepep_cpu_timeout, styles=("megatron", "plain")),
        Writer(_deepep_device_assert, styles=("megatron", "plain")),
        Writer(_nvshmem_ibgda, styles=("megatron", "plain")),
        Writer(_nccl_transport_then_generic),
        Writer(_nccl_timeout_then_generic),
    ),
    "nonfinite": (
        Writer(_csv_rows, phases=("startup",)),
        Writer(_step_values, phases=("startup",)),
        Writer(_verl_not_finite, phases=("init", "startup")),
        Writer(_fairseq_overflow, styles=("fairseq",)),
        Writer(_dllogger_scale, phases=("startup",)),
        Writer(_megatron_scale_halving, styles=("megatron",)),
        Writer(_tensor_at_stop),
    ),
    "signal": (
        Writer(_mpirun_killed),
        Writer(_glued_killed, phases=("startup", "training")),
        Writer(_deepspeed_return_code),
    ),
    "nccl_lines": (
        Writer(_nccl_retrying, phases=("init", "training")),
        Writer(_nccl_retries_exceeded, phases=("init", "training")),
        Writer(_mlx5_completion_error),
        Writer(_net_ib_failed, phases=("init", "training")),
    ),
    "rendezvous": (
        Writer(_host_unresolvable, phases=("startup",)),
        Writer(_nccl_host_unresolvable, phases=("init",)),
        Writer(_store_wait_in_framework, phases=("startup", "training")),
        Writer(_gloo_full_mesh, phases=("startup", "init")),
        Writer(_elastic_rendezvous, phases=("launch",)),
    ),
    "traceback": (
        Writer(_deepspeed_ssh_check, phases=("launch",)),
        Writer(_cublas_execution_failed),
        Writer(_duplicate_gpu, phases=("init",)),
    ),
}
