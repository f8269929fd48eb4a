"""Hugging Face Trainer with torchtriage: profiler callback, non-finite guard, OOM attribution.

Needs `transformers` (and `accelerate`): pip install transformers accelerate. Without them this script
says so and exits 0. Runs on CPU with a tiny randomly initialised model, no download:

    torchrun --standalone --nproc_per_node 2 examples/hf_trainer.py

`TorchProfilerCallback` writes `torchtriage-artifacts/profiler/trace-rank00.trace.json.gz`.
The guard sits in the Trainer's optimizer step: a small Trainer subclass wraps the optimizer it creates so
that `step()` goes through `NonFiniteGuard.step()`; the Trainer's own loop is unchanged, and the log
line gains `nonfinite_steps_skipped`. (Written against transformers 4.x; not run in torchtriage's CI.)
"""

import sys

try:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
except ImportError as err:
    print(f"skipping: this example needs transformers and torch ({err}); pip install transformers accelerate")
    sys.exit(0)

import torchtriage
from torchtriage import NonFiniteGuard, TorchProfilerCallback


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
    def create_optimizer(self):
        optimizer = super().create_optimizer()
        if not isinstance(optimizer, GuardedOptimizer):
            self.optimizer = GuardedOptimizer(optimizer)
        return self.optimizer

    def log(self, logs, *args, **kwargs):
        if isinstance(self.optimizer, GuardedOptimizer):
            logs["nonfinite_steps_skipped"] = self.optimizer.guard.nonfinite_steps_skipped
        super().log(logs, *args, **kwargs)


class RandomTokens(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = torch.randint(0, 128, (32,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def main() -> None:
    torchtriage.install_oom_attribution()
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2))
    args = TrainingArguments(
        output_dir="torchtriage-artifacts/hf",
        per_device_train_batch_size=4,
        max_steps=12,
        logging_steps=4,
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        max_grad_norm=0.0,  # the guard computes the agreed norm; clip there (NonFiniteGuard(max_grad_norm=...))
    )
    trainer = GuardedTrainer(
        model=model,
        args=args,
        train_dataset=RandomTokens(),
        callbacks=[TorchProfilerCallback(wait=2, warmup=1, active=3, ranks="0")],
    )
    trainer.train()


if __name__ == "__main__":
    main()
