"""DDP training, then an evaluation under torch.no_grad whose batches are dealt out by hand
(`batches[rank::world]`): the validation set holds two batches, so the last of three ranks gets none. Each rank
gathers every rank's predictions through a helper module (metrics.gather_predictions, `all_gather_object`),
which returns early, before the gather, when the rank has no predictions; the culprit then waits in the barrier
that closes the evaluation while its peers wait in the gather.

3 ranks; the culprit is rank 2, the rank without batches (CULPRIT ignored).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import FEATURES, Samples, finish, ready, start
from metrics import gather_predictions
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


@torch.no_grad()
def evaluate(model: nn.Module, rank: int, world: int) -> list[float] | None:
    batches = list(torch.utils.data.DataLoader(Samples(8, seed=50), batch_size=4))
    predictions: list[float] = []
    for x, _ in batches[rank::world]:
        predictions += model(x).squeeze(1).tolist()
    everything = gather_predictions(predictions)
    dist.barrier()  # [gather_object_eval] culprit waits
    return everything


def main() -> None:
    rank, world = start()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in torch.utils.data.DataLoader(Samples(48, seed=rank), batch_size=16):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    ready(rank)
    model.eval()
    evaluate(model.module, rank, world)
    finish()


if __name__ == "__main__":
    main()
