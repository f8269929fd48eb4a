"""Category accuracy and a confusion matrix of `torchtriage triage` on labelled real logs.

Usage: python benchmarks/triage_eval.py --corpus LABELLED.jsonl [--corpus MORE.jsonl] [--split-at N]
                                        [--show-misses] [--json]

Each line of the JSONL needs `excerpt` (the log text) and `label` (the expected category); `accept` (every
category that is a right answer), `id` and `key_facts` are used when present. The corpus is not part of
the repository: give its path (the development corpus of this project is `shared/corpus/dev_logs.jsonl`
beside the checkout, and is taken when it is there and no path is given).

Besides accuracy it reports how many of the numbers a good diagnosis names (ranks, sequence numbers,
sizes, timeouts, Xids — the digits in `key_facts`) the verdict carries in its facts or evidence: a
rough but honest proxy for "extracts the key facts wherever the log states them".

In the same run, a keyword baseline classifies every excerpt: ten regexes over the whole text, the
first that matches wins, else "hang" (a log that shows no error is most often a stalled job). It is the
floor: per category, torchtriage must be right at least as often. `--split-at N` reports the first N
excerpts and the rest apart (the development corpus: its older 66 and its newer 87).

The reliability table says how often a verdict is right at each confidence it states (high, medium, low),
and names the excerpts a verdict got wrong at high: a confident wrong verdict is the costliest mistake, and
the target is that `high` is right at least 99 % of the time.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

from torchtriage.analysis.pipeline import triage_text
from torchtriage.model import CATEGORIES

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "dev_logs.jsonl"
# The keyword baseline: the phrase most people would grep for, per category, most specific first.
KEYWORDS = (
    ("deepep", r"(?i)deep_?ep|nvshmem"),
    ("oom", r"(?i)cuda out of memory|OutOfMemoryError"),
    ("host_oom", r"(?i)out of memory|oom.?kill|signal 9|SIGKILL|MemoryError"),
    ("nccl_timeout", r"(?i)watchdog|timed? ?out"),
    ("nan_inf", r"(?i)\bnan\b|\binf\b|overflow"),
    ("gpu_fault", r"(?i)illegal memory access|device-side assert|Xid|ECC"),
    ("nccl_transport", r"(?i)nccl ?(?:error|warn)|ncclSystemError|ncclInternalError|unhandled (?:system|cuda) error"),
    ("rendezvous", r"(?i)rendezvous|TCPStore|address already in use"),
    ("environment", r"(?i)undefined symbol|version|not found|No such file|SIGBUS|/dev/shm"),
    ("usage", r"(?i)size mismatch|expected|unused parameters|KeyError|TypeError|ValueError"),
)
_KEYWORDS = [(category, re.compile(pattern)) for category, pattern in KEYWORDS]


def keyword_category(text: str) -> str:
    """The baseline's verdict: the first keyword that appears, else hang."""
    return next((category for category, pattern in _KEYWORDS if pattern.search(text)), "hang")


_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])")


def load(paths: list[Path]) -> list[dict]:
    rows = []
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                row = json.loads(line)
                row.setdefault("id", f"{path.name}:{number}")
                rows.append(row)
    return rows


def numbers_in_excerpt_facts(row: dict) -> set[str]:
    """Numbers named in key_facts that also occur in the excerpt (so the log states them)."""
    stated = set(_NUMBER.findall(row["excerpt"]))
    wanted = set()
    for fact in row.get("key_facts") or []:
        wanted |= {n for n in _NUMBER.findall(str(fact)) if n in stated}
    return wanted


def _corpus_paths(args: argparse.Namespace) -> list[Path] | None:
    paths = list(args.corpus or []) + list(args.paths)
    if not paths and DEFAULT_CORPUS.is_file():
        paths = [DEFAULT_CORPUS]
    missing = [p for p in paths if not p.is_file()]
    if not paths or missing:
        what = f"no such file: {', '.join(map(str, missing))}" if missing else "no corpus given"
        print(
            f"triage_eval: {what}. Give the labelled logs with --corpus PATH (JSON lines with `excerpt` and "
            "`label`); the development corpus is not part of the repository.",
            file=sys.stderr,
        )
        return None
    return paths


CONFIDENCE_LEVELS = ("high", "medium", "low")
HIGH_TARGET = 0.99


def reliability(outcomes: list[tuple[str, bool]]) -> dict[str, dict[str, float | int]]:
    """Per stated confidence: how many verdicts, how many right, the share right (None where there are none)."""
    table: dict[str, dict[str, float | int]] = {}
    for level in CONFIDENCE_LEVELS:
        stated = [right for confidence, right in outcomes if confidence == level]
        table[level] = {
            "n": len(stated),
            "right": sum(stated),
            "accuracy": sum(stated) / len(stated) if stated else None,
        }
    return table


def print_reliability(table: dict, wrong_at_high: list[str]) -> None:
    print("\nreliability: how often a verdict is right at the confidence it states")
    print(f"  {'confidence':>10} {'verdicts':>8} {'right':>6} {'accuracy':>9}")
    for level in CONFIDENCE_LEVELS:
        row = table[level]
        accuracy = f"{row['accuracy']:.1%}" if row["accuracy"] is not None else "-"
        print(f"  {level:>10} {row['n']:>8} {row['right']:>6} {accuracy:>9}")
    high = table["high"]["accuracy"]
    met = high is None or high >= HIGH_TARGET
    print(f"  high target >= {HIGH_TARGET:.0%}: {'met' if met else 'NOT met'}")
    for row_id in wrong_at_high:
        print(f"  wrong at high: {row_id}")


def right_answers(row: dict) -> list[str]:
    """Every category that is a right verdict for this excerpt: its `accept` list, else its label."""
    return list(row.get("accept") or [row["label"]])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path, help="labelled JSONL files (the same as --corpus)")
    parser.add_argument("--corpus", action="append", type=Path, metavar="PATH", help="a labelled JSONL file")
    parser.add_argument("--show-misses", action="store_true", help="print each misclassified excerpt's verdict")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--split-at", type=int, metavar="N", help="also report the first N excerpts and the rest apart")
    args = parser.parse_args()
    paths = _corpus_paths(args)
    if paths is None:
        return 2
    rows = load(paths)
    confusion: Counter[tuple[str, str]] = Counter()
    baseline: Counter[tuple[str, bool]] = Counter()  # (label, right) for the keyword baseline
    ours: Counter[tuple[str, bool]] = Counter()
    right_by_row: list[tuple[bool, bool]] = []
    outcomes: list[tuple[str, bool]] = []  # (stated confidence, right) per excerpt
    wrong_at_high: list[str] = []
    misses = []
    wanted_total = found_total = 0
    for row in rows:
        verdict = triage_text(row["excerpt"], row["id"])
        right = verdict.category in right_answers(row)
        floor = keyword_category(row["excerpt"]) in right_answers(row)
        ours[(row["label"], right)] += 1
        baseline[(row["label"], floor)] += 1
        right_by_row.append((right, floor))
        outcomes.append((str(verdict.confidence), right))
        if verdict.confidence == "high" and not right:
            wrong_at_high.append(row["id"])
        confusion[(row["label"], row["label"] if right else verdict.category)] += 1
        if not right:
            misses.append((row, verdict))
        wanted = numbers_in_excerpt_facts(row)
        carried = json.dumps(verdict.to_json()["facts"]) + " ".join(
            ev.text for f in verdict.findings for ev in f.evidence
        )
        carried_numbers = set(_NUMBER.findall(carried))
        wanted_total += len(wanted)
        found_total += len(wanted & carried_numbers)

    correct = sum(n for (label, got), n in confusion.items() if label == got)
    accuracy = correct / len(rows) if rows else 0.0
    labels = [c for c in CATEGORIES if any(c in key for key in confusion)]
    if args.json:
        print(
            json.dumps(
                {
                    "n": len(rows),
                    "accuracy": accuracy,
                    "facts_found": found_total,
                    "facts_wanted": wanted_total,
                    "confusion": {f"{a}->{b}": n for (a, b), n in sorted(confusion.items())},
                    "misses": [row["id"] for row, _ in misses],
                    "reliability": reliability(outcomes),
                    "wrong_at_high": wrong_at_high,
                    "baseline_accuracy": sum(f for _, f in right_by_row) / len(rows) if rows else 0.0,
                    "per_category": {
                        label: {
                            "ours": ours[(label, True)],
                            "baseline": baseline[(label, True)],
                            "n": ours[(label, True)] + ours[(label, False)],
                        }
                        for label in sorted({label for label, _ in ours})
                    },
                },
                indent=2,
            )
        )
        return 0
    print(f"excerpts: {len(rows)}   category accuracy: {correct}/{len(rows)} = {accuracy:.1%}")
    if wanted_total:
        print(f"key numbers carried in facts/evidence: {found_total}/{wanted_total} = {found_total / wanted_total:.1%}")
    floor_total = sum(f for _, f in right_by_row)
    print(
        f"keyword baseline (first of ten regexes, else hang): {floor_total}/{len(rows)} = {floor_total / len(rows):.1%}"
    )
    if args.split_at:
        for name, part in (("first", right_by_row[: args.split_at]), ("rest", right_by_row[args.split_at :])):
            if part:
                print(
                    f"  {name} {len(part)}: torchtriage {sum(r for r, _ in part)}/{len(part)}, "
                    f"baseline {sum(f for _, f in part)}/{len(part)}"
                )
    print("\nper category: torchtriage / baseline / excerpts (a ! marks a category below the baseline)")
    for label in sorted({label for label, _ in ours}):
        n = ours[(label, True)] + ours[(label, False)]
        mark = " !" if ours[(label, True)] < baseline[(label, True)] else ""
        print(f"  {label:>14} {ours[(label, True)]:>4} {baseline[(label, True)]:>4} {n:>4}{mark}")
    print_reliability(reliability(outcomes), wrong_at_high)
    short = {c: c[:8] for c in labels}
    print("\nconfusion (rows: label, columns: verdict)")
    print(" " * 15 + " ".join(f"{short[c]:>8}" for c in labels))
    for label in labels:
        cells = " ".join(f"{confusion[(label, got)] or '.':>8}" for got in labels)
        print(f"{label:>14} {cells}")
    if misses:
        print("\nmisclassified:")
        for row, verdict in misses:
            print(f"  {row['id']}: label {row['label']}, verdict {verdict.category} — {verdict.summary[:140]}")
            if args.show_misses:
                for finding in verdict.findings[:4]:
                    print(f"      [{finding.role}] {finding.kind}: {finding.message[:140]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
