"""DDP, and rank 0 uploads each epoch's metrics from a background thread that drains a queue until it reads the
sentinel `None`. At the end of the first epoch rank 0 closes the uploader, but its `close()` joins the thread
before it puts the sentinel: the join waits forever for a thread that waits for the sentinel. Rank 0 never
reaches the next epoch; its peers wait in the first gradient all-reduce of that epoch.

3 ranks; the culprit is rank 0, the uploader (CULPRIT ignored).
"""

import queue
import threading

import torch
import torch.nn.functional as F
from common import FEATURES, Samples, finish, ready, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class MetricsUploader:
    def __init__(self) -> None:
        self.pending: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._drain, name="metrics-uploader")
        self.thread.start()

    def _drain(self) -> None:
        while (item := self.pending.get()) is not None:
            _ = repr(item)  # stands in for the HTTP call

    def put(self, metrics: dict) -> None:
        self.pending.put(metrics)

    def close(self) -> None:
        self.thread.join()  # [thread_join_deadlock] departure
        self.pending.put(None)


def main() -> None:
    rank, world = start()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(Samples(48, seed=rank), batch_size=16)
    for epoch in range(3):
        uploader = MetricsUploader() if rank == 0 else None
        for x, y in loader:
            loss = F.mse_loss(model(x), y)
            loss.backward()  # [thread_join_deadlock] victim waits
            opt.step()
            opt.zero_grad()
            if uploader is not None:
                uploader.put({"epoch": epoch, "loss": loss.item()})
        if epoch == 0:
            ready(rank)
        if uploader is not None:
            uploader.close()
    finish()


if __name__ == "__main__":
    main()
