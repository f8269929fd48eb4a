"""Data, numerics or hardware: what every rank's replay of a skipped step says (pure: no torch).

`NonFiniteGuard(locate=True)` replays a skipped step twice on every rank and gathers, per rank,
whether its own loss was finite, whether its own (pre-reduction) gradients were, and the origin
each replay found (`locate_nonfinite`). From that one record, every rank decides the same:

- the weights non-finite on some replicas only, while the others are finite → **hardware**: replicas
  of one model can only diverge through a fault (silent data corruption) or a bug that wrote to one;
  the same for one rank's shard (FSDP2), since the guard applies only finite updates;
- weights non-finite on every rank → **numerics**: an earlier non-finite update reached them;
- a rank whose two replays disagree → **hardware**: the same batch on the same weights gave different
  answers on one device;
- nothing reproduced on any rank → **hardware** (a transient fault, or randomness the replay cannot
  repeat: dropout masks), unless a GradScaler is on: then the unscaled replay being finite means the
  *scaled* gradients overflowed, which the scaler handles by lowering its scale → **loss_scale**,
  not a NaN origin;
- reproduced, the same both times, on some ranks only → **data**: those ranks' batches;
- reproduced identically on every rank → **numerics** (precision, learning rate, the op named); with
  one rank, whose batch cannot be compared with a peer's, the batch is blamed instead when the
  non-finite values sit in some of its rows only or arrive with the input.

The record is one line of `DIR/nonfinite.jsonl` (schema `torchtriage.nonfinite/1`), and rank 0 logs
`log_line(...)`, a sentence the `nan_inf.origin_*` rules of `triage` read; the record holds the same
sentence (`line`), so `triage DIR` reads the file as a log.
"""

from __future__ import annotations

from typing import Any

from torchtriage.ranks import format_ranks

SCHEMA = "torchtriage.nonfinite/1"
_SAMPLES_SHOWN = 8


def _identity(origin: dict[str, Any] | None) -> tuple | None:
    """What makes two origins the same; one received from another rank is none of this rank's own."""
    if not origin or origin.get("received"):
        return None
    return tuple(origin.get(k) for k in ("phase", "module", "module_type", "op", "parameter"))


def _reproduced(info: dict[str, Any]) -> bool:
    """Whether this rank's replay produced the value itself (not received it through a collective)."""
    origin = info.get("origin")
    return bool(origin) and not origin.get("received")


def seen_on(ranks: dict[int, dict[str, Any]]) -> list[int]:
    """Ranks whose own loss, own gradients, or replay was non-finite.

    Gradients the guard saw after DDP averaged them (`grads_reduced`) are the same on every healthy
    rank, so they name a rank only when some ranks' are non-finite and others' are not.
    """
    grads = {r for r, info in ranks.items() if info.get("local_nonfinite")}
    reduced = any(info.get("grads_reduced") for info in ranks.values())
    if reduced and len(grads) == len(ranks):
        grads = set()
    return sorted(r for r, info in ranks.items() if info.get("loss_finite") is False or r in grads or _reproduced(info))


def judge(
    ranks: dict[int, dict[str, Any]], *, scaler: bool = False, sharded_weights: bool = False
) -> tuple[str | None, str]:
    """(suspect, evidence) for one skipped step; suspect is None when no rank replayed it."""
    replayed = {r: info for r, info in ranks.items() if info.get("replayed")}
    if not replayed:
        return None, "the step was not replayed (pass replay= to guard.step)"
    everyone = sorted(replayed)
    failed = sorted(r for r, info in replayed.items() if info.get("replay_error"))
    if failed:
        reason = replayed[failed[0]]["replay_error"]
        return "undetermined", f"the replay raised on {_ranks(failed)}: {reason}"
    in_weights = sorted(r for r, info in replayed.items() if (info.get("origin") or {}).get("phase") == "parameters")
    if in_weights:
        names = sorted(
            {replayed[r]["origin"].get("parameter") or replayed[r]["origin"].get("module") for r in in_weights}
        )
        shown = ", ".join(str(n) for n in names[:4])
        if len(in_weights) == len(everyone):
            return "numerics", f"the weights are non-finite on every rank ({shown}): an earlier update made them so"
        if sharded_weights:
            return (
                "hardware",
                f"non-finite weights in the shard of {_ranks(in_weights)} only ({shown}), while the updates the guard "
                "applied were finite: a fault on that device (silent data corruption) or a write to that shard",
            )
        return (
            "hardware",
            f"weights non-finite on {_ranks(in_weights)} only ({shown}) while the other replicas are finite: replicas "
            "of one model diverge only through a fault on that device (silent data corruption) or a write to one rank",
        )
    unstable = sorted(
        r for r, info in replayed.items() if _identity(info.get("origin")) != _identity(info.get("origin_again"))
    )
    if unstable:
        return (
            "hardware",
            f"two replays of the same batch on the same weights disagree on {_ranks(unstable)}: a non-deterministic "
            "result on that device",
        )
    reproduced = sorted(r for r in everyone if _reproduced(replayed[r]))
    if not reproduced:
        seen = seen_on(ranks)
        where = f" (it was seen on {_ranks(seen)})" if seen else ""
        if scaler:
            return (
                "loss_scale",
                "the replay without the loss scale is finite on every rank: the scaled gradients overflowed, which "
                "GradScaler handles by lowering its scale (not a NaN origin)",
            )
        return (
            "hardware",
            f"replaying the batch on the same weights stayed finite on {_ranks(everyone)}: the non-finite "
            f"value{where} was not reproduced (a transient fault on the device, or randomness the replay cannot "
            "repeat, such as dropout)",
        )
    if len(reproduced) < len(everyone):
        return (
            "data",
            f"reproduced on {_ranks(reproduced)} only, the same on both replays, while "
            f"{_ranks(_others(everyone, reproduced))} stayed finite: the batch on that rank",
        )
    first = replayed[reproduced[0]]["origin"]
    if len(everyone) == 1:
        values = first.get("values") or {}
        rows = values.get("rows") or []
        if first.get("phase") == "input":
            return "data", "the batch itself holds the non-finite value"
        if rows and len(rows) < values.get("rows_of", 0) and first.get("phase") in ("forward", "input"):
            return (
                "data",
                f"non-finite in rows {rows} of {values['rows_of']} only, the same on both replays: those samples",
            )
        return "numerics", "reproduced on both replays, in every row of the batch: the computation itself"
    if all(_identity(replayed[r]["origin"]) == _identity(first) for r in reproduced):
        if first.get("phase") == "input":
            return "data", f"every rank's batch holds non-finite values ({_ranks(everyone)})"
        return "numerics", f"reproduced identically on every rank ({_ranks(everyone)}): the computation, not one batch"
    return "numerics", f"reproduced on every rank ({_ranks(everyone)}), at different places: the computation"


def _others(everyone: list[int], some: list[int]) -> list[int]:
    chosen = set(some)
    return [r for r in everyone if r not in chosen]


def _ranks(ranks: list[int]) -> str:
    return format_ranks(ranks)


def first_rank(ranks: dict[int, dict[str, Any]]) -> int | None:
    """The rank whose origin the log line names: the lowest one that reproduced it."""
    reproduced = sorted(r for r, info in ranks.items() if _reproduced(info))
    return reproduced[0] if reproduced else None


def samples_of(info: dict[str, Any]) -> Any:
    """The sample ids of the rows the origin names, when the batch's ids line up with its rows."""
    ids = info.get("sample_ids")
    origin = info.get("origin") or {}
    values = origin.get("values") or {}
    rows = values.get("rows") or []
    if origin.get("phase") == "parameters":
        return None
    if (
        isinstance(ids, list)
        and rows
        and origin.get("phase") in ("input", "forward")
        and values.get("rows_of") == len(ids)
    ):
        return [ids[r] for r in rows if r < len(ids)][:_SAMPLES_SHOWN]
    return ids


def record(
    step: int,
    grad_norm: float,
    ranks: dict[int, dict[str, Any]],
    verdict: tuple[str | None, str] | None = None,
    *,
    scaler: bool = False,
    sharded_weights: bool = False,
) -> dict[str, Any]:
    """The `torchtriage.nonfinite/1` line for one skipped step; `verdict` is `judge`'s, if already made."""
    if verdict is None:
        verdict = judge(ranks, scaler=scaler, sharded_weights=sharded_weights)
    suspect, evidence = verdict
    entry: dict[str, Any] = {
        "schema": SCHEMA,
        "step": step,
        "grad_norm": grad_norm if grad_norm == grad_norm else None,  # JSON has no NaN
        "seen_on": seen_on(ranks),
        "ranks": {
            str(r): {
                "batch_index": info.get("batch_index"),
                "sample_ids": info.get("sample_ids"),
                "origin": info.get("origin"),
                **({"samples": samples_of(info)} if info.get("origin") else {}),
                **({"blocks": info["blocks"]} if info.get("blocks") else {}),
            }
            for r, info in sorted(ranks.items())
        },
        "reproduced": any(_reproduced(info) for info in ranks.values()),
        "suspect": suspect,
        "evidence": evidence,
    }
    # The sentence rank 0 logs, second in the line: `triage` reads nonfinite.jsonl as a log, so the
    # record is evidence without the job's own log, and it stays readable however many ranks follow.
    return {"schema": SCHEMA, "line": log_line(entry), **entry}


def log_line(entry: dict[str, Any]) -> str:
    """One sentence for the log, in the form the `nan_inf.origin_*` rules read."""
    step = entry["step"]
    ranks = {int(r): info for r, info in entry["ranks"].items()}
    suspect = entry.get("suspect")
    tail = f"; suspect: {suspect} ({entry['evidence']})" if suspect else ""
    rank = first_rank(ranks)
    if rank is None:
        blocks = next(
            ((r, i["blocks"]) for r, i in sorted(ranks.items()) if (i.get("blocks") or {}).get("block")), None
        )
        if blocks is not None:
            r, found = blocks
            return (
                f"torchtriage NonFiniteGuard: step {step}: non-finite first in the {found['phase']} of block "
                f"{found['block']} on rank {r} (block flags){tail}"
            )
        if suspect == "loss_scale":
            return f"torchtriage NonFiniteGuard: step {step}: GradScaler overflow, not a NaN origin{tail}"
        return f"torchtriage NonFiniteGuard: step {step}: non-finite value not reproduced by the replay{tail}"
    info = ranks[rank]
    origin = info["origin"]
    place = origin.get("module")
    if place is None:
        place = origin.get("module_type") or "the closure"
    elif place == "":
        place = origin.get("module_type") or "the model"
    op = origin.get("op") or origin.get("parameter")
    what = f" ({op})" if op else ""
    samples = info.get("samples")
    sample_text = f", sample ids {samples}" if samples not in (None, []) else ""
    if origin.get("phase") == "parameters":
        inputs = ""
    elif origin.get("inputs_finite"):
        top = origin.get("input_max_abs")
        inputs = "; inputs finite" + (f" (max |x| {top:.4g})" if isinstance(top, (int, float)) else "")
    else:
        inputs = "; inputs already non-finite"
    return (
        f"torchtriage NonFiniteGuard: step {step}: non-finite first in the {origin['phase']} of {place}{what} "
        f"on rank {rank}{sample_text}{inputs}{tail}"
    )
