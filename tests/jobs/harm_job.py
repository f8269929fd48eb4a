"""Job: what `torchtriage run` must never harm or misread, one behaviour per HARM_MODE.

HARM_MODE=<mode> HARM_SECONDS=<s> torchrun --nproc_per_node 2 tests/jobs/harm_job.py

busy             DDP training on gloo as fast as it goes for HARM_SECONDS, then exit 0: hundreds of steps
                 a second, the main thread almost always inside backward() when another thread looks
idle             DDP steps where rank 0 first sleeps HARM_PAUSE seconds (rank 1 waits in the gradient
                 all_reduce meanwhile), for HARM_SECONDS, then exit 0
stall_then_hang  DDP steps; rank 0 pauses HARM_PAUSE seconds once (a real stall, rank 0 the culprit);
                 steps again for HARM_SECONDS; then rank 1 sleeps forever while rank 0 waits in an
                 all_reduce (a real hang, rank 1 the culprit). Prints `HANG rank=<r> pid=<p>` then.
hang_on_go       DDP steps until the file HARM_GO exists, then rank 1 sleeps forever while rank 0 waits in
                 an all_reduce. Prints `READY rank=<r> pid=<p>` once stepping.
rank0_steps      rank 0 takes HARM_STEPS optimizer steps while rank 1 waits in a barrier; then rank 0
                 joins the barrier and both exit 0
own_timer        the program arms faulthandler.dump_traceback_later(HARM_PAUSE, exit=True), then sleeps:
                 its own timer must end it (exit code 1)
leave_groups     DDP training for HARM_SECONDS, prints DONE, all_reduces a few times and exits 0 at once,
                 without destroying the process group (the interpreter's exit tears it down)
child            each rank starts a child Python (it inherits RANK and the run's variables) that sleeps
                 HARM_PAUSE seconds, then the rank exits 0; the child outlives the job
"""

import faulthandler
import os
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import env_int, exit_when_orphaned  # the job folder is on sys.path
from torch.nn.parallel import DistributedDataParallel

FOREVER_S = 3600


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return default if value in (None, "") else float(value)


def model_and_optimizer():
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    )
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train_step(model, optimizer) -> None:
    loss = model(torch.randn(16, 32)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def train_for(seconds: float, model, optimizer, pause_rank: int | None = None, pause_s: float = 0.0) -> int:
    steps, end = 0, time.monotonic() + seconds
    while agreed(time.monotonic() < end):
        if dist.get_rank() == pause_rank:
            time.sleep(pause_s)
        train_step(model, optimizer)
        steps += 1
    return steps


def agreed(going_on: bool) -> bool:
    """Whether every rank goes on: a loop that ends on each rank's own clock would leave one rank in a step's
    all_reduce while the other has left."""
    flag = torch.tensor([1 if going_on else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def say(word: str) -> None:
    print(f"{word} rank={dist.get_rank()} pid={os.getpid()}", flush=True)


def main() -> None:
    mode = os.environ["HARM_MODE"]
    seconds, pause = env_float("HARM_SECONDS", 10.0), env_float("HARM_PAUSE", 0.3)
    if mode == "own_timer":
        faulthandler.dump_traceback_later(pause, exit=True)
        time.sleep(FOREVER_S)
    exit_when_orphaned()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    if mode == "child":
        subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({pause})"], start_new_session=True)
        dist.barrier()
        return
    if mode == "rank0_steps":
        if rank == 0:
            model = torch.nn.Linear(8, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            for _ in range(env_int("HARM_STEPS", 40)):
                model(torch.randn(4, 8)).sum().backward()
                optimizer.step()
        dist.barrier()
        print(f"DONE rank={rank}", flush=True)
        return
    model, optimizer = model_and_optimizer()
    if mode == "leave_groups":  # a healthy job that leaves its groups to the interpreter's exit, as many do
        train_for(seconds, model, optimizer)
        print(f"DONE rank={rank}", flush=True)
        for _ in range(50):  # the job's last work is collectives, and then the interpreter's exit at once
            dist.all_reduce(torch.ones(4))
        return
    if mode == "busy":
        print(f"DONE rank={rank} steps={train_for(seconds, model, optimizer)}", flush=True)
    elif mode == "idle":
        print(f"DONE rank={rank} steps={train_for(seconds, model, optimizer, 0, pause)}", flush=True)
    elif mode == "stall_then_hang":
        train_for(2.0, model, optimizer)
        if rank == 0:
            time.sleep(pause)  # a real stall: rank 1 waits in the step's gradient all_reduce meanwhile
        train_step(model, optimizer)
        train_for(seconds, model, optimizer)
        say("HANG")
        hang(rank)
    elif mode == "hang_on_go":
        train_step(model, optimizer)
        say("READY")
        while agreed(not os.path.exists(os.environ["HARM_GO"])):
            train_step(model, optimizer)
        say("HANG")
        hang(rank)
    else:
        raise SystemExit(f"unknown HARM_MODE {mode}")
    dist.destroy_process_group()


def hang(rank: int) -> None:
    if rank == 1:
        time.sleep(FOREVER_S)  # the culprit never joins
    dist.all_reduce(torch.ones(4))  # rank 0 waits here


if __name__ == "__main__":
    main()
