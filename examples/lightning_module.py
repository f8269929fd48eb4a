"""A LightningModule with torchtriage: the non-finite guard on the optimizer step, memory lines, OOM attribution.

Needs `lightning` (pip install lightning, or torchtriage[integrations]). Without it this script says so and
exits 0. Runs on CPU or GPUs:

    python examples/lightning_module.py
    torchrun --standalone --nproc_per_node 2 examples/lightning_module.py   # DDP over gloo (NCCL on GPUs)
    INJECT_NAN_STEP=5 torchrun --standalone --nproc_per_node 2 examples/lightning_module.py

Lightning calls `optimizer_step`; overriding it routes the step through `NonFiniteGuard`, which agrees
across ranks whether to apply it. The override runs Lightning's closure (training_step, zero_grad,
backward) itself and then the guard, so the precision plugin's own clipping and its
`on_before_optimizer_step` hook are not involved: clip with the guard (`max_grad_norm=`), and with
`precision="16-mixed"` the guard takes the plugin's GradScaler. `log_cuda_memory` logs memory each epoch
on GPU (nothing on CPU). `INJECT_NAN_STEP` puts a NaN into rank 1's gradient at that optimizer step:
every rank skips the update. Tested with lightning 2.6 (tests/test_runtime_integrations.py).
"""

import os
import sys

try:
    import lightning as L
    import torch
except ImportError as err:
    print(f"skipping: this example needs lightning and torch ({err}); pip install lightning")
    sys.exit(0)

import torchtriage
from torchtriage import NonFiniteGuard, log_cuda_memory

MAX_EPOCHS = int(os.environ.get("MAX_EPOCHS", "2"))
INJECT_NAN_STEP = int(os.environ.get("INJECT_NAN_STEP", "0"))


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.guard = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        inner = getattr(optimizer, "optimizer", optimizer)  # Lightning wraps it in a LightningOptimizer
        if self.guard is None:
            scaler = getattr(self.trainer.precision_plugin, "scaler", None)  # "16-mixed": agree on its inf flag
            self.guard = NonFiniteGuard(inner, scaler=scaler, max_grad_norm=1.0)
        if optimizer_closure is not None:
            optimizer_closure()  # runs training_step + zero_grad + backward, as Lightning's default step would
        if self.global_step + 1 == INJECT_NAN_STEP and self.global_rank == min(1, self.trainer.world_size - 1):
            next(self.parameters()).grad.view(-1)[0] = float("nan")  # demo only
        outcome = self.guard.step(batch_index=batch_idx, step=self.global_step + 1)
        self.log("nonfinite_steps_skipped", float(self.guard.nonfinite_steps_skipped))
        self.log("grad_norm", outcome.grad_norm)

    def on_train_epoch_end(self):
        log_cuda_memory(f"epoch {self.current_epoch}")


def main() -> None:
    torchtriage.install_oom_attribution()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=gen)
    data = torch.utils.data.TensorDataset(x, x[:, :1] * 3.0)
    loader = torch.utils.data.DataLoader(data, batch_size=32)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = L.Trainer(
        max_epochs=MAX_EPOCHS,
        accelerator="auto",
        devices=world if world > 1 else 1,
        strategy="ddp" if world > 1 else "auto",
        logger=False,
        enable_checkpointing=False,
    )
    module = Regression()
    trainer.fit(module, loader)
    guard = module.guard
    checksum = sum(p.detach().double().sum().item() for p in module.parameters())  # equal on every rank
    print(
        f"rank {trainer.global_rank}: global_step {trainer.global_step}, {guard.applied_steps} applied, "
        f"nonfinite_steps_skipped={guard.nonfinite_steps_skipped}, "
        f"skipped steps {[batch.step for batch in guard.skipped_batches]}, weights checksum {checksum:.6f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
