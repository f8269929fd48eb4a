"""Job: the step monitor as a Hugging Face Trainer callback or a Lightning callback (2 ranks, gloo, CPU).

FRAMEWORK: "hf" (StepMonitorCallback) or "lightning" (LightningStepMonitor). Rank SLOW_RANK's batches
each take SLOW_MS longer to collate (a slow data pipeline). The monitor writes to $MONITOR_OUT/monitor;
every rank writes `DONE {...}` with its decisions to $MONITOR_OUT/rank<r>.jsonl.
"""

import json
import os
import time

import torch

FRAMEWORK = os.environ["FRAMEWORK"]
OUT = os.environ["MONITOR_OUT"]
STEPS = int(os.environ.get("STEPS", "30"))
WINDOW = int(os.environ.get("WINDOW", "10"))
SLOW_RANK = int(os.environ.get("SLOW_RANK", "1"))
SLOW_MS = int(os.environ.get("SLOW_MS", "40"))
RANK = int(os.environ.get("RANK", "0"))


def slow_collate(samples):
    if RANK == SLOW_RANK:
        time.sleep(SLOW_MS / 1000)
    return torch.utils.data.default_collate(samples)


class Numbers(torch.utils.data.Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        x = torch.randn(16, generator=torch.Generator().manual_seed(i))
        return {"x": x, "y": x[:1] * 3.0}


def done(decisions) -> None:
    with open(os.path.join(OUT, f"rank{RANK}.jsonl"), "a") as out:
        out.write("DONE " + json.dumps({"rank": RANK, "decisions": decisions}) + "\n")


def hugging_face() -> None:
    from transformers import Trainer, TrainingArguments

    from torchtriage import StepMonitorCallback

    class Regression(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

        def forward(self, x, y):
            return {"loss": torch.nn.functional.mse_loss(self.net(x), y)}

    args = TrainingArguments(
        output_dir=os.path.join(OUT, "hf"),
        per_device_train_batch_size=8,
        max_steps=STEPS,
        logging_steps=1000,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=0,
    )
    callback = StepMonitorCallback(OUT, window=WINDOW)
    trainer = Trainer(
        model=Regression(), args=args, train_dataset=Numbers(), data_collator=slow_collate, callbacks=[callback]
    )
    trainer.train()
    done(callback.monitor.decisions)


def lightning() -> None:
    import lightning as L

    from torchtriage import LightningStepMonitor

    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.net(batch["x"]), batch["y"])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    callback = LightningStepMonitor(OUT, window=WINDOW)
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=int(os.environ.get("WORLD_SIZE", "1")),
        strategy="ddp",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[callback],
    )
    loader = torch.utils.data.DataLoader(Numbers(), batch_size=8, collate_fn=slow_collate)
    trainer.fit(Regression(), loader)
    done(callback.monitor.decisions)


if __name__ == "__main__":
    hugging_face() if FRAMEWORK == "hf" else lightning()
    # The Trainer leaves its process group to the interpreter's exit, where gloo's threads are sometimes torn
    # down out of order ("terminate called without an active exception", with or without the monitor).
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
