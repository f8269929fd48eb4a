"""GPU check of the streaming snapshot reader on real snapshots of a training loop; run on one GPU:

    OUT=${OUT:-/tmp/tt-gpu} MAX_ENTRIES=1500000 PYTHONPATH=src python tests/gpu/check_snapshot_stream.py

Trains a stack of MLP blocks with AdamW under `_record_memory_history(max_entries=MAX_ENTRIES)` (C++ and
Python stacks, torch's default), dumps the snapshot, then reads it three ways, each in its own process
with its wall time and peak memory: `torchtriage memory --json` (the streaming reader), the same analysis
after `pickle.load` of the whole file, and `python -m torch.cuda._memory_viz stats`. Prints
`PASS`/`FAIL` lines: the streamed and whole readings must agree on every number. Also writes a small
snapshot of the same loop (4,000 entries, gzipped) to keep as a fixture: `train_snapshot.pickle.gz`.
"""

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from measure import run_measured  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/tt-gpu"))
OUT.mkdir(parents=True, exist_ok=True)
failures = 0


def check(name: str, ok: bool, detail: str = "") -> None:
    global failures
    failures += not ok
    print(f"{'PASS' if ok else 'FAIL'} {name} {detail}".rstrip(), flush=True)


def train(steps: int, max_entries: int, path: Path) -> None:
    torch.manual_seed(0)
    torch.cuda.memory._record_memory_history(max_entries=max_entries)
    blocks = [
        torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)) for _ in range(6)
    ]
    model = torch.nn.Sequential(*blocks).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(steps):
        batch = torch.randn(32, 256, 1024, device="cuda")
        loss = model(batch).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    started = time.perf_counter()
    torch.cuda.memory._dump_snapshot(str(path))
    print(f"dumped {path.name}: {path.stat().st_size / 2**20:.1f} MB in {time.perf_counter() - started:.1f} s",
          flush=True)  # fmt: skip
    torch.cuda.memory._record_memory_history(enabled=None)
    del model, optimizer
    torch.cuda.empty_cache()


WHOLE = """
import json, pickle, sys
from torchtriage.analysis.memory import analyse_snapshot, build_memory_verdict, snapshot_from_data
with open(sys.argv[1], "rb") as f:
    data = pickle.load(f)
verdict = build_memory_verdict(analyse_snapshot(snapshot_from_data(data, sys.argv[1])))
print(json.dumps(verdict.facts["devices"], sort_keys=True, default=str))
"""


def main() -> int:
    small = OUT / "train_snapshot.pickle"
    train(steps=12, max_entries=4000, path=small)
    with open(small, "rb") as raw, gzip.open(str(small) + ".gz", "wb", compresslevel=9) as packed:
        shutil.copyfileobj(raw, packed)
    small.unlink()

    big = Path(os.environ.get("BIG_DIR", "/tmp")) / "big_snapshot.pickle"
    entries = int(os.environ.get("MAX_ENTRIES", "1500000"))
    train(steps=entries // 100 + 50, max_entries=entries, path=big)
    size = big.stat().st_size

    ours = run_measured([sys.executable, "-m", "torchtriage", "memory", str(big), "--json"], 500)
    whole = run_measured([sys.executable, "-c", WHOLE, str(big)], 500)
    viz = run_measured([sys.executable, "-W", "ignore", "-m", "torch.cuda._memory_viz", "stats", str(big)], 500)
    rows = {"file_mb": size / 2**20}
    for name, result in (("torchtriage memory", ours), ("pickle.load + analysis", whole), ("_memory_viz stats", viz)):
        rows[name] = {"wall_s": round(result["wall_s"], 2), "peak_mb": round(result["peak_mb"]), "rc": result["rc"]}
        print(f"{name:<24} {result['wall_s']:7.1f} s {result['peak_mb']:8.0f} MB  exit {result['rc']}", flush=True)
        if result["rc"] not in (0, 1):
            print(result["err"][-2000:], flush=True)
    (OUT / "snapshot_stream.json").write_text(json.dumps(rows, indent=1))

    streamed = json.loads(ours["out"])["facts"]["devices"] if ours["rc"] in (0, 1) else None
    loaded = json.loads(whole["out"]) if whole["rc"] == 0 else None
    check("streamed-equals-whole", streamed is not None and json.dumps(streamed, sort_keys=True, default=str)
          == json.dumps(loaded, sort_keys=True, default=str))  # fmt: skip
    if streamed:
        device = streamed[0]
        check("history-read", device["history_events"] > 0.9 * entries, f"events={device['history_events']}")
        top = device["top_sites"][0]["site"] if device["top_sites"] else ""
        check("site-in-user-code", "check_snapshot_stream.py" in top, top)
        # Streamed, not read whole after a fallback: a fraction of what the whole load needs.
        check("streamed-not-loaded-whole", ours["peak_mb"] < whole["peak_mb"] / 2,
              f"peak={ours['peak_mb']:.0f} MB, whole={whole['peak_mb']:.0f} MB")  # fmt: skip
    subprocess.run(["ls", "-la", str(OUT)], check=False)
    big.unlink()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
