"""Time to a verdict of `torchtriage diagnose --store` against simulated debug-server workers.

Usage: python benchmarks/store_diagnose.py [--ranks 256] [--silent 0.05] [--timeout 3]

Starts RANKS workers on loopback that serve the real handler names of PyTorch's debug server
(`pyspy_dump`, `fr_trace_json`; 404 for the others, as a CPU build), registers them in a real TCPStore
under `debug_server/rank<N>` as torch does, makes a fraction of them silent (they accept the connection
and never answer: a wedged process), and times the command from its start to the verdict, with the
culprit it names. Target: <= 5 s at 256 ranks with 5% silent.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from measure import run_measured  # noqa: E402  benchmarks/measure.py

from test_debug_server import _Workers  # noqa: E402  the simulated workers of the tests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--silent", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args()
    culprit = args.ranks // 3
    silent = set(random.Random(0).sample([r for r in range(args.ranks) if r != culprit], int(args.ranks * args.silent)))
    workers = _Workers(args.ranks, culprit=culprit, silent=silent)
    try:
        with tempfile.TemporaryDirectory() as out:
            command = [sys.executable, "-m", "torchtriage", "diagnose", "--store", workers.address]
            command += ["--timeout", str(args.timeout), "--out", out, "--json"]
            done = run_measured(command, 120)
    finally:
        workers.close()
    verdict = json.loads(done["out"]) if done["out"].strip().startswith("{") else {}
    answered = verdict.get("facts", {}).get("debug_server", {}).get("answered")
    print(
        f"{args.ranks} ranks, {len(silent)} silent, timeout {args.timeout:g} s: verdict in {done['wall_s']:.2f} s, "
        f"peak {done['peak_mb']:.0f} MB; culprit {verdict.get('culprit_ranks')} (truth [{culprit}]); "
        f"{answered} answered; target <= 5 s"
    )


if __name__ == "__main__":
    main()
