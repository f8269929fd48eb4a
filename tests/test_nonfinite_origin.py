"""Where a NaN was born, with NonFiniteGuard(locate=True): the verdict on data, the guard in one process,
and real torchrun + gloo jobs under DDP, FSDP2, activation checkpointing and torch.compile."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchtriage.runtime import nonfinite_verdict as V

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "jobs" / "nonfinite_origin_job.py"


def origin(phase="forward", module="layers.2.act", op="aten.exp", rows=None, rows_of=8, **extra):
    return {
        "phase": phase,
        "module": module,
        "module_type": "Exp",
        "op": op,
        "values": {"rows": rows or [], "rows_of": rows_of},
        **extra,
    }


def replayed(first=None, again="same", **info):
    return {"replayed": True, "origin": first, "origin_again": first if again == "same" else again, **info}


# -- the verdict, on data ---------------------------------------------------------------------------


def test_reproduced_on_one_rank_only_is_the_data():
    ranks = {0: replayed(None), 1: replayed(origin()), 2: replayed(None)}
    suspect, evidence = V.judge(ranks)
    assert suspect == "data" and "rank 1 only" in evidence


def test_reproduced_identically_everywhere_is_the_numerics():
    ranks = {r: replayed(origin(rows=list(range(8)))) for r in range(4)}
    assert V.judge(ranks)[0] == "numerics"
    ranks[3] = replayed(origin(module="layers.1.act"))
    assert V.judge(ranks)[0] == "numerics"  # everywhere, at different places: still the computation


def test_weights_non_finite_on_one_replica_is_the_hardware():
    weight = origin(phase="parameters", module="layers.1.fc", op=None, parameter="layers.1.fc.weight")
    ranks = {0: replayed(None), 1: replayed(weight)}
    suspect, evidence = V.judge(ranks)
    assert suspect == "hardware" and "layers.1.fc.weight" in evidence and "rank 1 only" in evidence
    assert V.judge({0: replayed(weight), 1: replayed(weight)})[0] == "numerics"
    assert V.judge(ranks, sharded_weights=True)[0] == "hardware"


def test_replays_that_disagree_or_reproduce_nothing_point_at_the_device():
    assert V.judge({0: replayed(None), 1: replayed(origin(), again=None)})[0] == "hardware"
    suspect, evidence = V.judge({0: replayed(None), 1: replayed(None, local_nonfinite=True)})
    assert suspect == "hardware" and "rank 1" in evidence
    assert V.judge({0: replayed(None), 1: replayed(None)}, scaler=True)[0] == "loss_scale"


def test_a_value_received_through_a_collective_is_not_a_rank_of_its_own():
    received = origin(received="c10d._allgather_base_")
    assert V.judge({0: replayed(received), 1: replayed(origin())})[0] == "data"
    assert V.first_rank({0: replayed(received), 1: replayed(origin())}) == 1


def test_one_rank_tells_the_data_from_the_numerics_by_its_rows():
    assert V.judge({0: replayed(origin(rows=[4], rows_of=8))})[0] == "data"
    assert V.judge({0: replayed(origin(rows=list(range(8)), rows_of=8))})[0] == "numerics"
    assert V.judge({0: replayed(origin(phase="input"))})[0] == "data"


def test_no_replay_or_a_failed_one_decides_nothing():
    assert V.judge({0: {"origin": None}, 1: {}})[0] is None
    suspect, evidence = V.judge({0: replayed(None), 1: {"replayed": True, "replay_error": "OutOfMemoryError: x"}})
    assert suspect == "undetermined" and "OutOfMemoryError" in evidence


def test_seen_on_ignores_gradients_every_rank_shares_after_ddp():
    shared = {r: {"local_nonfinite": True, "grads_reduced": True, "loss_finite": r != 2} for r in range(4)}
    assert V.seen_on(shared) == [2]
    one = {0: {"local_nonfinite": False, "grads_reduced": True}, 1: {"local_nonfinite": True, "grads_reduced": True}}
    assert V.seen_on(one) == [1]


def test_the_record_maps_rows_to_sample_ids_and_json_has_no_nan():
    ranks = {0: replayed(None, sample_ids=[0, 1]), 1: replayed(origin(rows=[1], rows_of=2), sample_ids=[10, 11])}
    entry = V.record(7, float("nan"), ranks)
    assert entry["schema"] == "torchtriage.nonfinite/1" and entry["grad_norm"] is None
    assert entry["ranks"]["1"]["samples"] == [11] and entry["seen_on"] == [1] and entry["reproduced"]
    json.dumps(entry, allow_nan=False)
    line = V.log_line(entry)
    assert line.startswith("torchtriage NonFiniteGuard: step 7: non-finite first in the forward of layers.2.act")
    assert "(aten.exp) on rank 1, sample ids [11]" in line and "suspect: data" in line


# -- the guard in one process -------------------------------------------------------------------------

torch = pytest.importorskip("torch")

from torchtriage import NonFiniteGuard  # noqa: E402


class Exp(torch.nn.Module):
    def forward(self, x):
        return torch.exp(x)


def small_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Exp(), torch.nn.Linear(4, 1))
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(4))
        model[0].bias.zero_()
    return model


def test_the_guard_replays_only_skipped_steps_and_writes_the_record(tmp_path, caplog):
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = NonFiniteGuard(opt, model=model, locate=True, report_dir=tmp_path, watch="blocks")
    replays = []

    def step(x, ids):
        def loss_of():
            replays.append(1)
            return model(x).mean()

        opt.zero_grad()
        loss = model(x).mean()
        loss.backward()
        return guard.step(loss=loss, batch_index=len(ids), sample_ids=ids, replay=loss_of)

    assert step(torch.ones(3, 4), [0, 1, 2]).applied
    assert replays == []  # nothing is replayed while the steps are finite
    bad = torch.ones(3, 4)
    bad[1] = 200.0
    with caplog.at_level("WARNING", logger="torchtriage.guard"):
        assert not step(bad, [7, 8, 9]).applied
    assert len(replays) == 2  # twice: a value born of the data is born again
    entry = json.loads((tmp_path / "nonfinite.jsonl").read_text())
    rank0 = entry["ranks"]["0"]
    assert (rank0["origin"]["module"], rank0["origin"]["op"]) == ("1", "aten.exp")
    assert rank0["samples"] == [8] and entry["suspect"] == "data" and entry["seen_on"] == [0]
    assert rank0["blocks"]["block"] == "1"
    assert guard.skipped_batches[-1].suspect == "data"
    assert "non-finite first in the forward of 1 (aten.exp) on rank 0, sample ids [8]" in caplog.text


def test_blocking_false_replays_the_skipped_batch_when_the_next_step_begins(tmp_path):
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, fused=True)
    guard = NonFiniteGuard(opt, model=model, locate=True, report_dir=tmp_path, watch="blocks", blocking=False)
    replays = []

    def step(x, ids):
        def loss_of(x=x):  # the closure holds its own batch: it runs a step later
            replays.append(1)
            return model(x).mean()

        opt.zero_grad()
        loss = model(x).mean()
        loss.backward()
        return guard.step(loss=loss, batch_index=len(ids), sample_ids=ids, replay=loss_of)

    assert step(torch.ones(3, 4), [0, 1, 2]).applied
    bad = torch.ones(3, 4)
    bad[1] = 200.0
    assert not step(bad, [7, 8, 9]).applied
    assert replays == []  # decided on the device; replayed when the next step begins
    assert step(torch.ones(3, 4), [3, 4, 5]).applied
    assert len(replays) == 2
    entry = json.loads((tmp_path / "nonfinite.jsonl").read_text())
    rank0 = entry["ranks"]["0"]
    assert entry["step"] == 2 and (rank0["origin"]["module"], rank0["origin"]["op"]) == ("1", "aten.exp")
    assert rank0["samples"] == [8] and entry["suspect"] == "data" and rank0["blocks"]["block"] == "1"


def test_a_grad_scaler_overflow_is_not_a_nan_origin(tmp_path):
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)  # the scaled gradients overflow fp32
    guard = NonFiniteGuard(opt, scaler=scaler, model=model, locate=True, report_dir=tmp_path)
    x = torch.ones(3, 4)
    loss = model(x).mean()
    scaler.scale(loss).backward()
    assert not guard.step(loss=loss, replay=lambda: model(x).mean()).applied
    entry = json.loads((tmp_path / "nonfinite.jsonl").read_text())
    assert entry["suspect"] == "loss_scale" and not entry["reproduced"]


def test_a_replay_that_raises_is_reported_and_training_goes_on(tmp_path):
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = NonFiniteGuard(opt, model=model, locate=True, report_dir=tmp_path)
    bad = torch.ones(3, 4)
    bad[0] = 200.0
    loss = model(bad).mean()
    loss.backward()

    def broken():
        raise RuntimeError("CUDA out of memory in the replay")

    assert not guard.step(loss=loss, replay=broken).applied
    entry = json.loads((tmp_path / "nonfinite.jsonl").read_text())
    assert entry["suspect"] == "undetermined" and "out of memory" in entry["evidence"]
    opt.zero_grad()
    model(torch.ones(3, 4)).mean().backward()
    assert guard.step(replay=broken).applied  # the next, finite step is applied as usual


def test_the_closure_may_return_a_model_output_with_a_loss():
    from torchtriage import locate_nonfinite

    model = small_model()
    bad = torch.ones(3, 4)
    bad[2] = 200.0
    found = locate_nonfinite(model, lambda: {"loss": model(bad).mean(), "logits": None})
    assert (found["module"], found["op"]) == ("1", "aten.exp")


def test_locate_and_watch_need_the_model():
    opt = torch.optim.SGD(small_model().parameters(), lr=0.1)
    with pytest.raises(ValueError, match="model="):
        NonFiniteGuard(opt, locate=True)


def test_the_record_goes_to_the_run_folder_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHTRIAGE_RUN_DIR", str(tmp_path))
    model = small_model()
    guard = NonFiniteGuard(torch.optim.SGD(model.parameters(), lr=0.1), model=model, locate=True)
    assert guard.report_dir == str(tmp_path)


# -- real jobs ----------------------------------------------------------------------------------------

TORCHRUN = Path(sys.executable).parent / "torchrun"
EVERY_FAULT = "2:exp_sample,4:zero_sample,6:log_loss,8:fp16,10:grad_inf,12:bf16,14:weight_nan"


def run_job(tmp_path: Path, wrap: str, faults: str) -> tuple[dict[int, dict], str]:
    done = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", str(JOB)],
        env={**os.environ, "WRAP": wrap, "FAULTS": faults, "GUARD_OUT": str(tmp_path), "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "nonfinite.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in records}, done.stdout + done.stderr


def origin_of(record, rank):
    return record["ranks"][str(rank)]["origin"]


def check_one_rank_data(record, module, op, sample):
    assert record["suspect"] == "data" and record["seen_on"] == [1], record["evidence"]
    healthy = origin_of(record, 0)  # under FSDP2 it may receive rank 1's value through a collective
    assert healthy is None or healthy["received"]
    found = origin_of(record, 1)
    assert (found["phase"], found["module"], found["op"], found["inputs_finite"]) == ("forward", module, op, True)
    assert record["ranks"]["1"]["samples"] == [sample]


def check_weights_on_one_rank(record):
    assert record["suspect"] == "hardware" and record["seen_on"][-1] == 1
    found = origin_of(record, 1)
    assert (found["phase"], found["parameter"]) == ("parameters", "layers.1.fc.weight")


@pytest.mark.slow
def test_every_fault_under_ddp(tmp_path):
    records, output = run_job(tmp_path, "ddp", EVERY_FAULT)
    assert sorted(records) == [2, 4, 6, 8, 10, 12, 14]
    # sample ids of rank 1 at step s are (2s + 1) * 8 ... + 7; the bad one sits at position 5
    check_one_rank_data(records[2], "layers.2.act", "aten.exp", 45)
    check_one_rank_data(records[4], "layers.0.norm", "aten.div", 77)
    log = origin_of(records[6], 1)
    assert records[6]["suspect"] == "data" and (log["module_type"], log["op"]) == ("LikelihoodLoss", "aten.log")
    fp16 = records[8]
    assert fp16["suspect"] == "numerics" and fp16["seen_on"] == [0, 1]
    for rank in (0, 1):
        assert (origin_of(fp16, rank)["module"], origin_of(fp16, rank)["dtype"]) == ("layers.2.act", "float16")
    assert records[10]["suspect"] == "hardware" and not records[10]["reproduced"] and records[10]["seen_on"] == [1]
    bf16 = records[12]
    assert bf16["suspect"] == "numerics" and bf16["seen_on"] == [0, 1]
    assert {(origin_of(bf16, r)["module"], origin_of(bf16, r)["dtype"]) for r in (0, 1)} == {
        ("layers.2.act", "bfloat16")
    }
    check_weights_on_one_rank(records[14])
    assert records[2]["ranks"]["1"]["blocks"]["block"] == "layers.2"
    # rank 0's lines are read by triage: the first origin is a data verdict on rank 1 with its sample
    log_file = tmp_path / "job.log"
    log_file.write_text(output)
    verdict = subprocess.run(
        [sys.executable, "-m", "torchtriage", "triage", str(log_file), "--json"], capture_output=True, text=True
    )
    kinds = {f["kind"] for f in json.loads(verdict.stdout)["findings"]}
    assert {"nan_inf.origin_data", "nan_inf.origin_numerics", "nan_inf.origin_hardware"} <= kinds


@pytest.mark.slow
def test_fsdp2_replays_together_and_names_the_shard(tmp_path):
    records, _ = run_job(tmp_path, "fsdp2", "2:exp_sample,4:zero_sample,10:grad_inf,12:weight_nan")
    check_one_rank_data(records[2], "layers.2.act", "aten.exp", 45)
    check_one_rank_data(records[4], "layers.0.norm", "aten.div", 77)
    assert records[10]["suspect"] == "hardware" and not records[10]["reproduced"]
    check_weights_on_one_rank(records[12])
    received = origin_of(records[12], 0)  # rank 0 gathered rank 1's broken shard
    assert received["received"].startswith("fsdp.") and received["module"] == "layers.1.fc"


@pytest.mark.slow
@pytest.mark.parametrize("wrap", ["ddp_checkpoint", "ddp_compile"])
def test_checkpointed_and_compiled_models(tmp_path, wrap):
    records, _ = run_job(tmp_path, wrap, "2:exp_sample,4:zero_sample,6:weight_nan")
    check_one_rank_data(records[2], "layers.2.act", "aten.exp", 45)
    check_one_rank_data(records[4], "layers.0.norm", "aten.div", 77)
    check_weights_on_one_rank(records[6])
    assert origin_of(records[2], 1)["compiled"] is (wrap == "ddp_compile")


def test_triage_reads_the_guards_records_as_evidence(tmp_path):
    from conftest import run_cli

    ranks = {0: replayed(None, sample_ids=[0, 1]), 1: replayed(origin(rows=[1], rows_of=2), sample_ids=[10, 11])}
    # one record alone is a single JSON document; two are JSON lines: both are read as the guard's log
    for count in (1, 2):
        records = [V.record(step, float("nan"), ranks) for step in range(1, count + 1)]
        (tmp_path / "nonfinite.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        verdict = json.loads(run_cli("triage", "--json", tmp_path).stdout)
        assert verdict["category"] == "nan_inf" and verdict["culprit_ranks"] == [1]
        assert verdict["findings"][0]["kind"] == "nan_inf.origin_data"
        assert len(verdict["findings"][0]["evidence"]) == count


@pytest.mark.slow
def test_under_torchtriage_run_the_records_go_to_the_run_folder(tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "torchtriage", "run", "--out", str(run_dir), "--"]
        + [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", str(JOB)],
        env={**os.environ, "FAULTS": "2:exp_sample,4:weight_nan", "GUARD_OUT": str(tmp_path), "REPORT_DIR": "default"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not (tmp_path / "nonfinite.jsonl").exists()
    records = [json.loads(line) for line in (run_dir / "nonfinite.jsonl").read_text().splitlines()]
    assert [r["suspect"] for r in records] == ["data", "hardware"]
    verdict = subprocess.run(
        [sys.executable, "-m", "torchtriage", "triage", "--json", str(run_dir)], capture_output=True, text=True
    )
    found = json.loads(verdict.stdout)
    assert found["category"] == "nan_inf" and found["culprit_ranks"] == [1]
    assert {"nan_inf.origin_data", "nan_inf.origin_hardware"} <= {f["kind"] for f in found["findings"]}
    titles = [a["title"] for a in found["actions"]]
    assert "Check rank 1's GPU for errors" in titles and "Check the GPUs of the job for errors" not in titles
