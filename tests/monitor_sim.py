"""A seeded simulator of data-parallel training steps, measured as the step monitor measures them.

Each rank is a host thread and, on a GPU job, a device stream. The host waits for its batch, launches the
forward's, backward's and optimizer's kernels one by one (each launch costs host time; a launch blocks while
the device's queue is full), and waits for its device where the loop synchronises (a pageable copy of the
batch at the forward's start, the loss read every step or every tenth, or never). The device runs each
kernel once it is launched and the kernel before it is done. The gradient all-reduce couples the ranks: it
completes when the last rank's backward is done plus its own cost, and the device (on CPU, the host) waits
for it before the optimizer. Costs carry per-step noise, rare spikes, and on a loaded host a per-window
load of each rank.

A fault is planted on one rank (slow data, slow compute, slow launch) or on every rank (slower links,
a slower device, slower data) from a window on. What the monitor sees is computed from the timelines
exactly where the monitor takes it (`step_phases`): the data wait, the host from the batch to the first
backward, the device's forward from an event recorded at the batch's arrival to one at the backward
(sampled steps, read only once done by the window's end), whether that forward was done when the host had
launched the backward. The truth comes from the simulation alone: a fault *holds the job back* when the
same seed without it runs measurably faster.

Nothing here imports the decision; `decide` runs the windows through it the way the monitor does.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

KERNELS = 16  # per phase: the forward, the backward, the optimizer
FAULTS = ("none", "data", "compute", "launch", "comm", "job_compute", "job_data", "load")
RANK_FAULTS = {"data": "data", "compute": "compute", "launch": "launch"}


@dataclass
class Scenario:
    seed: int
    ranks: int
    gpu: bool
    sync: str  # GPU: "forward" (pageable copy), "step" (loss read), "every10", "none"
    window: int
    windows: int
    sample_every: int
    data: float
    launch: tuple[float, float, float]  # host seconds to launch the forward, backward, optimizer
    compute: tuple[float, float, float]  # device (or CPU) seconds of the forward, backward, optimizer
    allreduce: float
    noise: float  # per-step relative noise of every cost
    spikes: float  # chance per step and rank of a spike (a descheduled thread)
    load: float  # per-window relative load of each rank (a busy host)
    fault: str = "none"
    fault_rank: int = 1
    fault_window: int = 4  # the first window the fault holds (windows counted from 0)
    amount: float = 0.0  # seconds added (data, launch, comm) or factor (compute, job_compute)
    queue: int = 3 * KERNELS  # kernels the device's queue holds before a launch blocks
    sizes: tuple[float, ...] = (1.0 / KERNELS,) * KERNELS  # each kernel's share of its phase's cost

    @property
    def onset_step(self) -> int:
        return self.fault_window * self.window


def generate(seed: int, fault: str | None = None) -> Scenario:
    rng = random.Random(seed)
    fault = fault or rng.choice(FAULTS)
    gpu = fault == "launch" or fault != "load" and rng.random() < 0.6
    compute_fwd = rng.uniform(4e-3, 60e-3)
    launch_fwd = rng.uniform(1e-3, 8e-3) if gpu else 0.0
    scenario = Scenario(
        seed=seed,
        ranks=rng.choice((2, 2, 3, 4, 8)),
        gpu=gpu,
        sync=rng.choice(("forward", "step", "every10", "none")) if gpu else "step",
        window=rng.choice((10, 20)),
        windows=12,
        sample_every=1,
        data=rng.uniform(0.05e-3, 3e-3),
        launch=(launch_fwd, 1.5 * launch_fwd, 0.3 * launch_fwd),
        compute=(compute_fwd, 2 * compute_fwd, rng.uniform(0.5e-3, 5e-3)),
        allreduce=rng.uniform(1e-3, 20e-3),
        noise=rng.uniform(0.01, 0.12 if fault == "load" else 0.06),
        spikes=rng.uniform(0.0, 0.01),
        load=rng.uniform(0.02, 0.06) if fault == "load" else 0.0,
        fault=fault,
        fault_rank=rng.randrange(1 << 16),
        fault_window=rng.choice((3, 4, 5)) if fault in RANK_FAULTS else rng.choice((4, 5, 6)),
    )
    scenario.fault_rank %= scenario.ranks
    weights = [rng.lognormvariate(0.0, 0.7) for _ in range(KERNELS)]
    scenario.sizes = tuple(w / sum(weights) for w in weights)
    scenario.sample_every = max(1, min(5, scenario.window // 5))
    step = sum(scenario.compute) + scenario.allreduce + scenario.data
    amounts = {
        "data": rng.uniform(0.1, 0.5) * step,
        "launch": rng.uniform(0.1, 0.5) * step + compute_fwd,  # beyond the device's forward: it starves
        "comm": rng.uniform(0.1, 0.5) * step,
        "job_data": rng.uniform(0.1, 0.5) * step,
        "compute": 2.0,  # the forward twice
        "job_compute": rng.uniform(1.3, 2.0),
    }
    return replace(scenario, amount=amounts.get(fault, 0.0))


# -- one job's timelines ---------------------------------------------------------------------------------


@dataclass
class _Rank:
    host: float = 0.0
    device: float = 0.0  # when the device's stream has done everything launched so far
    starts: list = field(default_factory=list)  # device start of each launched kernel (for the queue)

    def launch(self, host_cost: float, device_cost: float, queue: int, gpu: bool) -> None:
        if not gpu:
            self.host += host_cost + device_cost
            return
        self.host += host_cost
        if len(self.starts) >= queue:  # the queue is full: the launch returns once an older kernel started
            self.host = max(self.host, self.starts[-queue])
        start = max(self.device, self.host)
        self.starts.append(start)
        self.device = start + device_cost

    def event(self) -> tuple[float, float]:
        """(host time recorded, device time completed) of an event recorded now."""
        return self.host, max(self.device, self.host)

    def synchronise(self) -> None:
        self.host = max(self.host, self.device)


class _Job:
    def __init__(self, scenario: Scenario, with_fault: bool):
        self.s = scenario
        self.with_fault = with_fault
        self.rng = random.Random(scenario.seed * 7919 + 1)  # the same noise with and without the fault
        self.ranks = [_Rank() for _ in range(scenario.ranks)]
        self.loads = [1.0] * scenario.ranks

    def faulty(self, step: int, rank: int | None = None) -> bool:
        s = self.s
        return self.with_fault and step >= s.onset_step and (rank is None or rank == s.fault_rank)

    def cost(self, value: float) -> float:
        return value * math.exp(self.rng.gauss(0.0, self.s.noise))

    def spike(self) -> float:
        """A thread descheduled, a collection of garbage: now and then a step of one rank loses some time."""
        s, rng = self.s, self.rng
        return (
            rng.uniform(1.0, 5.0)
            * (s.data + s.launch[0] + (0.0 if s.gpu else s.compute[0]))
            * (rng.random() < s.spikes)
        )

    def phase(self, rank: int, index: int, step: int, extra_launch: float = 0.0) -> None:
        s, r = self.s, self.ranks[rank]
        launch, compute = s.launch[index], s.compute[index]
        if index == 0 and s.fault == "compute" and self.faulty(step, rank):
            launch, compute = launch * s.amount, compute * s.amount
        if s.fault == "job_compute" and self.faulty(step):
            compute *= s.amount
        load = self.loads[rank]
        for size in s.sizes:
            host = self.cost(launch / KERNELS) * load + extra_launch / KERNELS
            device = self.cost(compute * size) * (1.0 if s.gpu else load)
            r.launch(host, device, s.queue, s.gpu)

    def step(self, step: int, rows: list[list[dict]]) -> None:
        s = self.s
        if step % s.window == 0 and s.load:
            self.loads = [math.exp(self.rng.gauss(0.0, s.load)) for _ in range(s.ranks)]
        sampled = step % s.sample_every == 0
        marks = []
        for rank, r in enumerate(self.ranks):
            began = r.host
            data = self.cost(s.data) * self.loads[rank] + self.spike()
            if s.fault == "data" and self.faulty(step, rank) or s.fault == "job_data" and self.faulty(step):
                data += s.amount
            r.host += data
            batch = r.event()
            if s.gpu and s.sync == "forward":
                r.synchronise()
            delay = s.amount if s.fault == "launch" and self.faulty(step, rank) else 0.0
            self.phase(rank, 0, step, extra_launch=delay)
            backward = r.event()
            self.phase(rank, 1, step)
            paced = backward[1] <= r.host  # the device's forward was done once the backward was launched
            marks.append((began, data, batch, backward, paced))
        ready = [r.device if s.gpu else r.host for r in self.ranks]
        comm = self.cost(s.allreduce) + (s.amount if s.fault == "comm" and self.faulty(step) else 0.0)
        done = max(ready) + comm
        for rank, r in enumerate(self.ranks):
            if s.gpu:
                r.device = max(r.device, done)
            else:
                r.host = max(r.host, done)
            self.phase(rank, 2, step)
            if s.gpu and (s.sync == "step" or s.sync == "every10" and step % 10 == 9):
                r.synchronise()
            began, data, batch, backward, paced = marks[rank]
            wall = r.host - began
            forward = backward[0] - batch[0]
            row = {"wall": wall, "data": data, "forward": forward, "outside": wall - data - forward}
            row["gpu"] = row["host_paced"] = None
            if s.gpu and sampled:
                row["_done"] = r.event()[1]  # the step's end event: read once the device passed it
                row["gpu"], row["host_paced"] = backward[1] - batch[1], paced
            rows[rank].append(row)


def run(scenario: Scenario, with_fault: bool = True) -> list[list[list[dict]]]:
    """Per window, per rank, the rows the monitor keeps (device times only where read by the window's end)."""
    job = _Job(scenario, with_fault)
    windows = []
    for w in range(scenario.windows):
        rows: list[list[dict]] = [[] for _ in range(scenario.ranks)]
        for step in range(w * scenario.window, (w + 1) * scenario.window):
            job.step(step, rows)
        for rank, r in enumerate(job.ranks):
            for row in rows[rank]:
                if row.pop("_done", 0.0) > r.host:
                    row["gpu"] = row["host_paced"] = None
        windows.append(rows)
    return windows


def mean_step(windows: list[list[list[dict]]], first_window: int) -> float:
    walls = [row["wall"] for rows in windows[first_window:] for row in rows[0]]
    return sum(walls) / len(walls)


# -- the truth ------------------------------------------------------------------------------------------


@dataclass
class Truth:
    allowed: set  # (kind, rank, reason) a decision may say from the fault's window on
    must_name: bool  # the fault holds the job back clearly: a right decision must come
    growth: float  # the job's step with the fault against without, from the fault's window on


def truth(scenario: Scenario) -> Truth:
    s = scenario
    if s.fault in ("none", "load"):
        allowed = {("job", None, r) for r in ("compute", "data")} if s.fault == "load" else set()
        return Truth(allowed, False, 0.0)
    faulty = mean_step(run(s, True), s.fault_window)
    clean = mean_step(run(s, False), s.fault_window)
    growth = faulty / clean - 1.0
    if s.fault in RANK_FAULTS:
        reasons = {RANK_FAULTS[s.fault]}
        if s.fault == "compute" and s.gpu and s.compute[0] < 2 * s.launch[0]:
            reasons.add("launch")  # a forward the host cannot launch fast enough is host paced, twice over
        if s.fault == "launch" and _forward_tail(s) > s.launch[1] / 2:
            # The forward's last kernels may outlast the backward's launch (within a factor two of it, with
            # noise): the events the monitor places cannot tell a device that waited for its host from one
            # that computed (docs: launch or compute).
            reasons.add("compute")
        allowed = {("straggler", s.fault_rank, reason) for reason in reasons}
    else:
        reason = {"comm": "communication", "job_compute": "compute", "job_data": "data"}[s.fault]
        allowed = {("job", None, reason)}
        if s.fault == "job_compute" and s.gpu:
            allowed.add(("job", None, "launch"))
    # Clearly: the job is at least 10% slower and the slowdown is many times the step's own noise. A device
    # forward done by the time its host had launched the backward, on a rank whose peers wait for their
    # devices inside their forward (the pageable copy), cannot be told from a host that merely lags
    # behind its peers: it may go unnamed (docs). A slow launch always reads so; a doubled forward does
    # when the device trails its host by less than (twice) the backward's launch.
    paced = s.fault == "launch" or s.fault == "compute" and 2 * (s.compute[0] - s.launch[0]) < 2 * s.launch[1]
    unseen = s.gpu and s.sync == "forward" and paced
    return Truth(allowed, growth > max(0.10, 6 * s.noise) and not unseen, growth)


def _forward_tail(s: Scenario) -> float:
    """The longest the device can still be busy with the forward once the host has launched it all: after
    any kernel, the device's work left less the host's launches left (the slow rank's, with its delay)."""
    per_launch = (s.launch[0] + s.amount) / KERNELS
    return max(s.compute[0] * sum(s.sizes[k:]) - per_launch * (KERNELS - 1 - k) for k in range(KERNELS))


def decide(scenario: Scenario, windows: list[list[list[dict]]]) -> list[dict]:
    """Every window through the decision, as the monitor runs it (record, exchange, decide)."""
    from torchtriage.runtime import step_phases, straggler

    decider = straggler.Decider()
    decisions = []
    for index, rows in enumerate(windows):
        records = {rank: step_phases.window_record(rank_rows) for rank, rank_rows in enumerate(rows)}
        stats = {rank: step_phases.from_exchanged(step_phases.exchanged(r)) for rank, r in records.items()}
        first = index * scenario.window + 1
        decisions += decider.window(first, first + scenario.window - 1, stats)
    return decisions


def _long_sample(count: int, start: int) -> None:
    """Every seed of a long sample: the decisions against the truth, and the seeds that went wrong."""
    wrong, missed, total = {}, {}, {}
    for seed in range(start, start + count):
        scenario = generate(seed)
        found = truth(scenario)
        decisions = decide(scenario, run(scenario))
        said = {(d["kind"], d["rank"], d["reason"]) for d in decisions}
        total[scenario.fault] = total.get(scenario.fault, 0) + 1
        if (
            not said <= found.allowed
            or any(d["first_step"] <= scenario.onset_step for d in decisions)
            and (scenario.fault != "load")
        ):
            wrong[scenario.fault] = wrong.get(scenario.fault, 0) + 1
            print(f"wrong  seed {seed} {scenario.fault}: {sorted(said, key=str)}", flush=True)
        elif found.must_name and not said & found.allowed:
            missed[scenario.fault] = missed.get(scenario.fault, 0) + 1
            print(f"missed seed {seed} {scenario.fault} (the job {found.growth:.0%} slower)", flush=True)
    for fault in FAULTS:
        counts = (total.get(fault, 0), wrong.get(fault, 0), missed.get(fault, 0))
        print(f"{fault:12s} {counts[0]:5d} jobs  {counts[1]:3d} wrong  {counts[2]:3d} missed")


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent / "src"))
    _long_sample(int(sys.argv[1]) if len(sys.argv) > 1 else 500, int(sys.argv[2]) if len(sys.argv) > 2 else 0)
