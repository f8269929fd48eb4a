"""A LightningModule with torchtriage: the non-finite guard on the optimizer step, memory lines, OOM attribution.

Needs `lightning` (pip install lightning). Without it this script says so and exits 0. Runs on CPU:

    python examples/lightning_module.py
    torchrun --standalone --nproc_per_node 2 examples/lightning_module.py   # DDP over gloo

Lightning calls `optimizer_step`; overriding it routes the step through `NonFiniteGuard`, which agrees
across ranks whether to apply it. `log_cuda_memory` logs memory each epoch on GPU (nothing on CPU).
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
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        inner = getattr(optimizer, "optimizer", optimizer)  # Lightning wraps it in a LightningOptimizer
        if self.guard is None:
            self.guard = NonFiniteGuard(inner, max_grad_norm=1.0)
        if optimizer_closure is not None:
            optimizer_closure()  # runs training_step + backward, as Lightning's default step would
        outcome = self.guard.step(batch_index=batch_idx)
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
        max_epochs=2,
        accelerator="auto",
        devices=world if world > 1 else 1,
        strategy="ddp" if world > 1 else "auto",
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(Regression(), loader)


if __name__ == "__main__":
    main()
