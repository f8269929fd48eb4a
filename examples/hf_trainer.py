"""Hugging Face Trainer with torchtriage: profiler callback, non-finite guard, OOM attribution.

Needs `transformers` and `accelerate` (pip install transformers accelerate, or torchtriage[integrations]).
Without them this script says so and exits 0. Runs on CPU (gloo) or GPUs with a tiny randomly initialised
model, no download:

    torchrun --standalone --nproc_per_node 2 examples/hf_trainer.py
    INJECT_NAN_STEP=6 PROFILE_RANKS=all torchrun --standalone --nproc_per_node 2 examples/hf_trainer.py

`TorchProfilerCallback` writes `$OUT/profiler/trace-rankNN.trace.json.gz` on the ranks in `PROFILE_RANKS`.
The guard sits in the Trainer's optimizer step: a small Trainer subclass wraps the optimizer it creates so
that `step()` goes through `NonFiniteGuard.step()` (accelerate's wrapper calls it); the Trainer's own
loop is unchanged, and each log line gains `nonfinite_steps_skipped`. `INJECT_NAN_STEP` puts a NaN into
rank 1's gradient before that optimizer step: every rank skips the update. Tested with transformers 5.24
and accelerate 1.15 (tests/test_runtime_profiler.py).
"""

import gc
import os
import sys

try:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
except ImportError as err:
    print(f"skipping: this example needs transformers and torch ({err}); pip install transformers accelerate")
    sys.exit(0)

import torchtriage
from torchtriage import NonFiniteGuard, TorchProfilerCallback

STEPS = int(os.environ.get("STEPS", "12"))
INJECT_NAN_STEP = int(os.environ.get("INJECT_NAN_STEP", "0"))
PROFILE_RANKS = os.environ.get("PROFILE_RANKS", "0")
OUT = os.environ.get("OUT", "torchtriage-artifacts")


class GuardedOptimizer(torch.optim.Optimizer):
    """Delegates to the real optimizer, but `step()` goes through the guard (skip non-finite updates).

    A subclass of Optimizer only so that LR schedulers accept it; every attribute comes from the real one.
    """

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.__dict__["_inner"] = optimizer
        self.__dict__["guard"] = NonFiniteGuard(optimizer, max_consecutive_nonfinite_steps=16)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def step(self, closure=None):
        self.guard.step(closure)

    def zero_grad(self, set_to_none: bool = True):
        self._inner.zero_grad(set_to_none=set_to_none)

    # Optimizer's own methods would look for state on this wrapper: send them to the real optimizer.
    def state_dict(self):
        return self._inner.state_dict()

    def load_state_dict(self, state_dict):
        self._inner.load_state_dict(state_dict)

    def add_param_group(self, param_group):
        self._inner.add_param_group(param_group)


class GuardedTrainer(Trainer):
    guard = None

    def create_optimizer(self, *args, **kwargs):
        optimizer = super().create_optimizer(*args, **kwargs)
        if not isinstance(optimizer, GuardedOptimizer):
            self.optimizer = GuardedOptimizer(optimizer)
        # Keep the guard here: accelerate wraps self.optimizer again when training starts.
        self.guard = self.optimizer.guard
        return self.optimizer

    def log(self, logs, *args, **kwargs):
        if self.guard is not None:
            logs["nonfinite_steps_skipped"] = self.guard.nonfinite_steps_skipped
        super().log(logs, *args, **kwargs)


class InjectNaN(TrainerCallback):
    """Demo only: a NaN in one rank's gradient just before the optimizer step `step`."""

    def __init__(self, step: int):
        self.step = step

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        if state.global_step + 1 == self.step and rank == min(1, world - 1):
            next(p for p in model.parameters() if p.grad is not None).grad.view(-1)[0] = float("nan")
        return control


class RandomTokens(torch.utils.data.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        ids = torch.randint(0, 128, (32,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def main() -> None:
    torchtriage.install_oom_attribution()
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    )
    args = TrainingArguments(
        output_dir=f"{OUT}/hf",
        per_device_train_batch_size=4,
        max_steps=STEPS,
        logging_steps=4,
        save_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        ddp_find_unused_parameters=False,
        max_grad_norm=0.0,  # the guard computes the agreed norm; clip there (NonFiniteGuard(max_grad_norm=...))
    )
    callbacks = [TorchProfilerCallback(f"{OUT}/profiler", wait=2, warmup=1, active=3, ranks=PROFILE_RANKS)]
    if INJECT_NAN_STEP:
        callbacks.append(InjectNaN(INJECT_NAN_STEP))
    trainer = GuardedTrainer(model=model, args=args, train_dataset=RandomTokens(), callbacks=callbacks)
    trainer.train()
    guard = trainer.guard
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())  # equal on every rank
    print(
        f"rank {args.process_index}: {guard.step_count} guarded steps, {guard.applied_steps} applied, "
        f"nonfinite_steps_skipped={guard.nonfinite_steps_skipped}, "
        f"skipped steps {[batch.step for batch in guard.skipped_batches]}, weights checksum {checksum:.6f}",
        flush=True,
    )
    # The Trainer leaves the process group to the interpreter's exit, where gloo may abort. Drop the trainer
    # (and with it DDP's reducer) first: a reducer freed after the group was destroyed frees the group itself,
    # and gloo's destructor then joins its worker threads holding the GIL, which a worker freeing a tensor
    # needs (pytorch/pytorch#56297): the process never exits.
    del trainer, model, guard
    gc.collect()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
