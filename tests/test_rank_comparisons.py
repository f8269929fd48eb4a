"""Checks that compare every rank's value with the printing rank's own, read from every rank's line or from a few.

Two of PyTorch's checks all-gather a value from every rank and have each rank compare them with its own in rank
order, raising at the first that differs: TORCH_DISTRIBUTED_DEBUG=DETAIL's collective check (c10d
ProcessGroupWrapper.cpp, `verify_tensors`: "Rank <self> is running collective: <own>, but Rank <peer> is running
collective: <peer's>") and DDP's model check (c10d comm.cpp, `verify_params_across_processes`: "DDP expects same
model across all ranks, but Rank <self> has <n> params, while rank <peer> has inconsistent <m> params"). One line
names two ranks, not the one that departed. `check_lines` below plays that loop for a job whose departed ranks
hold another value; the verdicts are checked against the job's truth on real recordings and on thousands of drawn
jobs, read whole, one line at a time, and as any subset of the ranks' lines.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from conftest import FIXTURES, triage_json
from torchtriage.analysis.pipeline import triage_text

LOGS = FIXTURES / "logs"
OPS = ("BROADCAST", "ALLGATHER", "REDUCE_SCATTER", "BARRIER")
CASES = 300


def fingerprint(seq: int, op: str, shape: list[int]) -> str:
    """A fingerprint as `operator<<(CollectiveFingerPrint)` prints it (a barrier has no tensors)."""
    if op == "BARRIER":
        return f"CollectiveFingerPrint(SequenceNumber={seq}OpType=BARRIER)"
    dims = ", ".join(map(str, shape))
    return (
        f"CollectiveFingerPrint(SequenceNumber={seq}, OpType={op}, TensorShape=[{dims}], TensorDtypes=Float, "
        "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda, layout=Strided (default), "
        "requires_grad=false (default), pinned_memory=false (default), memory_format=(nullopt)))"
    )


def drawn_job(rng: random.Random, check: str) -> tuple[list[int], dict[int, str]]:
    """A job whose departed ranks (a strict minority) hold one or two other values: (departed, values)."""
    world = rng.randint(2, 24)
    departed = sorted(rng.sample(range(world), rng.randint(1, max(1, (world - 1) // 2))))
    if check == "nccl_version":  # NCCL's code of a release: 22703 is 2.27.3
        healthy = rng.choice((21903, 22005, 22103, 22703))
        others = [str(v) for v in rng.sample([v for v in (21602, 21805, 22307, 22805) if v != healthy], 2)]
        return departed, {r: rng.choice(others) if r in departed else str(healthy) for r in range(world)}
    if check == "ddp":
        params = rng.randint(1, 5000)
        others = [str(rng.choice((0, params + rng.randint(1, 9), max(0, params - rng.randint(1, 9)))))]
        return departed, {r: rng.choice(others) if r in departed else str(params) for r in range(world)}
    seq = rng.randint(0, 5000)
    healthy = fingerprint(seq, "ALLREDUCE", [rng.randint(1, 10**6)])
    others = [
        rng.choice(
            (
                fingerprint(seq, rng.choice(OPS), [rng.randint(1, 10**6)]),  # another collective
                fingerprint(seq, "ALLREDUCE", [rng.randint(1, 10**6), 3]),  # another shape
                fingerprint(seq + 1, "ALLREDUCE", [rng.randint(1, 10**6)]),  # one collective more before
            )
        )
        for _ in range(rng.choice((1, 1, 2)))
    ]
    return departed, {r: rng.choice(others) if r in departed else healthy for r in range(world)}


def check_lines(check: str, values: dict[int, str]) -> dict[int, str]:
    """Each rank's line, as the check raises it: its own value and the first rank's that differs."""
    lines = {}
    for rank, own in values.items():
        peer = next((r for r in sorted(values) if values[r] != own), None)
        if peer is None:
            continue
        if check == "nccl_version":  # nccl src/init.cc initTransportsRank's WARN
            text = f"Mismatched NCCL version detected : rank {peer} version {values[peer]} rank {rank} version {own}"
        elif check == "ddp":
            text = (
                f"DDP expects same model across all ranks, but Rank {rank} has {own} params, while rank {peer} has "
                f"inconsistent {values[peer]} params."
            )
        else:
            text = (
                f"Detected mismatch between collectives on ranks. Rank {rank} is running collective: {own}, but Rank "
                f"{peer} is running collective: {values[peer]}."
            )
        lines[rank] = f"[rank{rank}]: RuntimeError: {text}"
    return lines


def outcome(verdict, departed: list[int]) -> str:
    named = sorted(verdict.culprit_ranks)
    if named and set(named) - set(departed):
        return f"wrong-{verdict.confidence}"
    if named:
        return f"{'right' if named == departed else 'part'}-{verdict.confidence}"
    candidates = set(verdict.facts.get("candidates") or [])
    return "candidates" if candidates & set(departed) else "none"


def read(lines: dict[int, str], ranks: list[int]):
    return triage_text("\n".join(lines[r] for r in ranks) + "\n", "console.log")


@pytest.mark.parametrize("check, category", [("detail", "hang"), ("ddp", "usage"), ("nccl_version", "environment")])
def test_every_ranks_line_names_exactly_the_departed_ranks_and_two_ranks_stay_candidates(check, category):
    for seed in range(CASES):
        departed, values = drawn_job(random.Random(seed), check)
        lines = check_lines(check, values)
        ranks = list(lines)
        random.Random(-seed).shuffle(ranks)
        verdict = read(lines, ranks)
        assert verdict.category == category, seed
        if len(values) == 2:
            assert verdict.culprit_ranks == [] and sorted(verdict.facts["candidates"]) == [0, 1], seed
        else:
            assert (verdict.culprit_ranks, verdict.confidence) == (departed, "high"), seed


@pytest.mark.parametrize("check", ["detail", "ddp", "nccl_version"])
def test_one_ranks_line_alone_never_names_a_rank_at_high_and_a_healthy_ranks_line_names_a_departed_one(check):
    # Ranks below the peer a line names run the printing rank's collective: a healthy rank's line names the first
    # departed rank. A departed rank's line can make the departed look like the majority of the ranks it shows:
    # then the verdict may name a healthy rank, at medium (counted, not excluded).
    counts = Counter()
    for seed in range(CASES):
        rng = random.Random(seed)
        departed, values = drawn_job(rng, check)
        lines = check_lines(check, values)
        rank = rng.choice(sorted(lines))
        verdict = read(lines, [rank])
        assert not (verdict.culprit_ranks and verdict.confidence == "high"), seed
        result = outcome(verdict, departed)
        counts[result] += 1
        if rank not in departed:
            assert result in ("right-medium", "part-medium", "candidates"), (seed, result)
    medium = sum(n for k, n in counts.items() if k.endswith("medium"))
    assert counts["wrong-medium"] <= 0.1 * medium, counts


@pytest.mark.parametrize("check", ["detail", "ddp", "nccl_version"])
def test_any_subset_of_the_lines_is_right_at_its_stated_confidence(check):
    # Logs that hold only some ranks' lines (one node's of several): a majority of the ranks shown may be the
    # departed ones. Calibration holds: high right >= 99 %, medium >= 90 % (a subset of the departed counts).
    counts = Counter()
    for seed in range(CASES * 3):
        rng = random.Random(seed)
        departed, values = drawn_job(rng, check)
        lines = check_lines(check, values)
        shown = rng.sample(sorted(lines), rng.randint(1, len(lines)))
        counts[outcome(read(lines, shown), departed)] += 1
    for level, target in (("high", 0.99), ("medium", 0.90)):
        said = sum(n for k, n in counts.items() if k.endswith(level))
        assert counts[f"wrong-{level}"] <= (1 - target) * said, counts


def test_on_a_subgroup_the_ranks_named_are_the_jobs_and_a_rank_no_prefix_places_is_not_named():
    # The check numbers ranks in the group it compared ("Rank 1" of a group of ranks 4-7); a launcher's prefix
    # numbers them in the job. A departed rank whose own line gives its prefix is named in the job's numbering; one
    # only a peer's line shows is not named at all (a group rank is not a rank of the job).
    for seed in range(CASES):
        rng = random.Random(seed)
        departed, values = drawn_job(rng, "detail")
        offset = rng.randint(1, 64)
        lines = {
            g: line.replace(f"[rank{g}]:", f"[rank{g + offset}]:", 1)
            for g, line in check_lines("detail", values).items()
        }
        shown = sorted(lines) if rng.random() < 0.5 else rng.sample(sorted(lines), rng.randint(1, len(lines)))
        verdict = read(lines, shown)
        in_job = {d + offset for d in departed}
        assert set(verdict.culprit_ranks) <= in_job, (seed, verdict.culprit_ranks)
        assert set(verdict.facts.get("candidates") or []) <= {g + offset for g in shown} | in_job, seed
        if shown == sorted(lines) and len(values) > 2:
            assert sorted(verdict.culprit_ranks) == sorted(in_job), seed


def fsdp_order_line(values: dict[int, str]) -> str | None:
    """FSDP's first-iteration check (fsdp/_exec_order_utils.py, _check_order): the first pair of ranks, in
    itertools.combinations order, whose counts of parameters to all-gather differ; every rank raises the same."""
    pairs = ((r1, r2) for r1 in sorted(values) for r2 in sorted(values) if r1 < r2)
    r1, r2 = next(((a, b) for a, b in pairs if values[a] != values[b]), (None, None))
    if r1 is None:
        return None
    return (
        f"RuntimeError: Forward order differs across ranks: rank {r1} is all-gathering {values[r1]} parameters "
        f"while rank {r2} is all-gathering {values[r2]} parameters"
    )


def test_fsdp_forward_order_names_the_rank_apart_or_candidates_never_high():
    # One line, the same on every rank: with one departed rank it is never wrong; with several it may name a healthy
    # rank at medium when the departed are the lowest ranks (counted, as for one DETAIL line).
    counts = Counter()
    for seed in range(CASES):
        departed, values = drawn_job(random.Random(seed), "ddp")
        line = fsdp_order_line(values)
        text = "".join(f"[rank{r}]: {line}\n" for r in values)
        verdict = triage_text(text, "console.log")
        assert verdict.category == "hang" and verdict.confidence != "high", seed
        result = outcome(verdict, departed)
        counts[result] += 1
        if len(departed) == 1:  # rank 0 and every rank below the one apart side together: it is named
            assert result == ("right-medium" if departed[0] >= 2 else "candidates"), (seed, departed, result)
    assert counts["wrong-medium"] <= 0.1 * sum(n for k, n in counts.items() if k.endswith("medium")), counts


@pytest.mark.parametrize(
    "case, culprits, candidates, high",
    [("detail_mismatch_4ranks", [2], None, True), ("detail_mismatch_2ranks", [], [0, 1], False)],
)
def test_recorded_detail_checks(case, culprits, candidates, high):
    # Real gloo jobs under TORCH_DISTRIBUTED_DEBUG=DETAIL (tests/jobs/mismatch_size.py): the culprit's model has
    # one more output, so its gradient all-reduce has another shape; every rank raises the check's error.
    _, verdict = triage_json(LOGS / case / "run.log")
    assert verdict["category"] == "hang"
    assert verdict["culprit_ranks"] == culprits
    assert (verdict["confidence"] == "high") is high
    assert verdict["facts"].get("candidates") == candidates
    finding = next(f for f in verdict["findings"] if f["kind"] == "logs.fingerprint_mismatch")
    assert "[17]" in finding["message"] and "[34]" in finding["message"]


def test_monitored_barrier_names_the_rank_rank_0_waited_for_not_itself(tmp_path):
    # ProcessGroupGloo::monitoredBarrier: rank 0 raises "[Rank 0]: Rank <srcRank> failed to pass monitoredBarrier".
    log = tmp_path / "console.log"
    log.write_text("[rank0]: RuntimeError: [Rank 0]: Rank 2 failed to pass monitoredBarrier in 5000 ms\n")
    _, verdict = triage_json(log)
    assert (verdict["category"], verdict["culprit_ranks"]) == ("hang", [2])
