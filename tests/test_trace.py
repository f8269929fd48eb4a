"""`torchtriage trace`: the real 2×H200 and gloo recordings, synthetic traces built here, and bad input."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from torchtriage import exit_codes
from torchtriage.analysis.trace import analyse_traces, breakdown, build_trace_verdict, intersect, union
from torchtriage.cli import main
from torchtriage.knowledge.kernels import COMMUNICATION, COMPUTE, MEMORY, kernel_table
from torchtriage.sources.profiler_trace import TraceReadError, read_trace, stream_trace

FIXTURES = Path(__file__).parent / "fixtures"
H200 = FIXTURES / "h200x2" / "trace"
GLOO = FIXTURES / "traces" / "gloo_cpu"


def _analyse(folder: Path):
    traces = [read_trace(str(p)) for p in sorted(folder.glob("*.json.gz"))]
    return analyse_traces(traces)


def test_h200_straggler_is_rank_1_because_of_its_data_phase():
    analysis = _analyse(H200)
    assert analysis.straggler == 1
    reasons = analysis.straggler_reasons
    assert reasons[0]["kind"] == "data" and reasons[0]["phase"] == "data"
    assert reasons[0]["excess_us"] > 25_000  # 30 ms of sleep plus 20 matmuls per step
    assert any(r["kind"] == "compute" for r in reasons)  # the 20 extra matmuls
    verdict = build_trace_verdict(analysis)
    assert verdict.category == "straggler" and verdict.culprit_ranks == [1]
    assert "`data` phase is longer" in verdict.summary
    assert verdict.actions[0].title == "Speed up rank 1's input pipeline"


def test_h200_breakdown_parts_sum_to_the_step():
    analysis = _analyse(H200)
    for rank in analysis.ranks:
        assert rank.has_gpu and len(rank.steps) == 6
        for step in rank.steps:
            parts = step.compute + step.communication + step.memory + step.idle
            assert parts == pytest.approx(step.duration, rel=1e-9, abs=1e-6)
            assert 0 <= step.overlapped_communication <= step.compute + 1e-6
    rank0, rank1 = analysis.ranks
    # Rank 0's GPU spends its steps waiting in all_reduce for rank 1; rank 1's GPU idles while it sleeps.
    assert sum(s.communication for s in rank0.steps) > 0.9 * sum(s.duration for s in rank0.steps)
    assert sum(s.idle for s in rank1.steps) > 0.8 * sum(s.duration for s in rank1.steps)


def test_h200_collectives_matched_with_latency_bandwidth_and_last_rank():
    analysis = _analyse(H200)
    assert len(analysis.collectives) == 24  # 4 all_reduce per step, 6 steps, matched on both ranks
    big = [c for c in analysis.collectives if c.bytes == 4096 * 2048 * 4]
    assert len(big) == 12
    for c in big:
        assert c.ranks == [0, 1] and c.kind == "allreduce"
        assert c.latency == min(c.durations.values())
        # NCCL: busbw = algbw * 2(n-1)/n = algbw for n = 2
        assert c.busbw_gbps == pytest.approx(c.algbw_gbps)
        assert 50 < c.busbw_gbps < 1000  # NVLink on H200
    first_of_step = [c for c in analysis.collectives if c.key.endswith("/0")]
    assert all(c.last_rank == 1 and c.skew > 30_000 for c in first_of_step)


def test_gloo_cpu_trace_names_rank_1_without_gpu_or_comm_records():
    analysis = _analyse(GLOO)
    assert analysis.straggler == 1
    assert analysis.straggler_reasons[0]["phase"] == "data"
    assert any("no GPU events" in p for p in analysis.problems)
    assert any("no record_param_comms" in p for p in analysis.problems)
    assert len(analysis.collectives) == 20


def test_cli_text_json_html(tmp_path, capsys):
    html = tmp_path / "t.html"
    assert main(["trace", str(H200), "--json", "--html", str(html)]) == exit_codes.PROBLEM_FOUND
    data = json.loads(capsys.readouterr().out)
    assert data["category"] == "straggler" and data["culprit_ranks"] == [1]
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert "rank 1" in page
    assert main(["trace", str(H200 / "trace_rank0.json.gz"), str(H200 / "trace_rank1.json.gz")]) == 1
    assert "rank 1 is the straggler" in capsys.readouterr().out


def test_offline_verb_does_not_import_torch(tmp_path):
    import subprocess

    code = (
        "import sys; from torchtriage.cli import main; main(['trace', sys.argv[1], '--json']); "
        "main(['memory', sys.argv[2], '--json']); assert 'torch' not in sys.modules, 'torch imported'"
    )
    snapshot = FIXTURES / "h200x2" / "oom_snapshot.pickle"
    result = subprocess.run([sys.executable, "-c", code, str(H200), str(snapshot)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# ----------------------------------------------------------------------------- synthetic


def _kernel(name, ts, dur, corr, cat="kernel", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "External id": corr} | args}  # fmt: skip


def _launch(ts, corr):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts, "dur": 1,
            "args": {"correlation": corr}}  # fmt: skip


def _comm(ts, dur, ext, nelems=1 << 20):
    return {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {"External id": ext, "Collective name": "allreduce", "In msg nelems": nelems,
                     "Out msg nelems": nelems, "dtype": "Float", "Process Group Name": "0",
                     "Process Group Ranks": "[0, 1, 2, 3]", "Group size": 4}}  # fmt: skip


def _synthetic_rank(rank: int, steps: int = 3, data_us: float = 100.0, extra_events: int = 0) -> dict:
    """Each step: a `data` range, compute 1000 µs, an allreduce overlapping 200 µs of it, a memcpy, idle."""
    events, corr = [], 1000 * rank
    t = 0.0
    for step in range(steps):
        start = t
        events.append({"ph": "X", "cat": "user_annotation", "name": "data", "pid": 1, "tid": 1, "ts": t,
                       "dur": data_us})  # fmt: skip
        t += data_us
        corr += 1
        events += [_launch(t, corr), _kernel("sm90_gemm", t + 10, 1000, corr)]
        corr += 1
        nccl = "ncclKernel_AllReduce_RING_LL_Sum_float" if rank % 2 else "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
        events += [_launch(t + 1, corr), _comm(t + 1, 5, corr), _kernel(nccl, t + 810, 400 + (3 - rank) * 50, corr)]
        corr += 1
        events += [_launch(t + 2, corr), _kernel("Memcpy DtoH (Device -> Pinned)", t + 1300, 50, corr, "gpu_memcpy")]
        events.append({"ph": "X", "cat": "gpu_user_annotation", "name": "data", "pid": 0, "tid": 7, "ts": t,
                       "dur": 5000})  # fmt: skip
        t += 1500
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                       "ts": start, "dur": t - start})  # fmt: skip
    for i in range(extra_events):
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": i, "dur": 1,
                       "args": {"External id": i, "Input Dims": [[1024], [1024]]}})  # fmt: skip
    return {"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": 4}, "traceEvents": events,
            "traceName": "x"}  # fmt: skip


def _write(tmp_path, name, data, gz=False):
    path = tmp_path / name
    text = json.dumps(data)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_interval_arithmetic():
    assert union([(5, 6), (0, 2), (1, 3), (3, 4)]) == [(0, 4), (5, 6)]
    assert intersect([(0, 4), (5, 6)], [(3, 5.5)]) == [(3, 4), (5, 5.5)]
    parts = breakdown([(0, 10, COMPUTE), (8, 14, COMMUNICATION), (13, 16, MEMORY), (2, 3, COMPUTE)], 0, 20)
    assert parts == {"compute": 10, "communication": 4, "memory": 2, "idle": 4, "overlapped_communication": 2}


def test_synthetic_four_ranks_straggler_and_both_nccl_namings(tmp_path):
    for rank in range(4):
        _write(tmp_path, f"r{rank}.json", _synthetic_rank(rank, data_us=3000 if rank == 2 else 100))
    # Rank 2's slow data phase does not change kernel durations here; make it arrive last instead:
    analysis = _analyse_folder(tmp_path)
    step = analysis.ranks[0].steps[0]
    assert step.compute == 1000 and step.overlapped_communication == 200
    assert step.communication == pytest.approx(200 + 50 * 3 - 0)  # rank 0's allreduce runs 550 µs, 200 hidden
    for rank in analysis.ranks:
        assert rank.steps[0].communication > 0, "ncclKernel_* and ncclDevKernel_* are both communication"
    # Durations 550, 500, 450, 400 µs: rank 3 has the shortest allreduce, so it arrived last each time.
    assert {c.last_rank for c in analysis.collectives} == {3}
    assert analysis.collectives[0].latency == 400
    assert analysis.collectives[0].busbw_gbps == pytest.approx((1 << 22) / 400e-6 / 1e9 * 1.5)
    assert analysis.straggler == 3


def _analyse_folder(folder):
    return analyse_traces([read_trace(str(p)) for p in sorted(folder.glob("*.json*"))])


def test_streaming_reads_across_chunk_boundaries_and_gzip(tmp_path, monkeypatch):
    import torchtriage.sources.profiler_trace as pt

    monkeypatch.setattr(pt, "_CHUNK", 7)  # every event straddles many chunks
    data = _synthetic_rank(0, steps=2)
    plain = read_trace(str(_write(tmp_path, "trace_rank5.json", data | {"distributedInfo": {}})))
    zipped = read_trace(str(_write(tmp_path, "t.json.gz", data, gz=True)))
    assert plain.rank == 5  # from the file name, as distributedInfo has none
    assert zipped.rank == 0
    assert list(plain.gpu_ts) == list(zipped.gpu_ts) and len(plain.gpu_ts) == 6
    assert list(plain.gpu_kind) == [COMPUTE, COMMUNICATION, MEMORY] * 2
    assert plain.events == len(data["traceEvents"])


def test_bare_array_and_events_before_header(tmp_path):
    events = _synthetic_rank(0)["traceEvents"]
    path = _write(tmp_path, "bare_rank3.json", events)
    assert read_trace(str(path)).rank == 3
    seen = {}
    text = '{"traceEvents": [], "distributedInfo": {"rank": 9}}'
    (tmp_path / "h.json").write_text(text)
    assert list(stream_trace(str(tmp_path / "h.json"), seen.__setitem__)) == []
    assert seen["distributedInfo"] == {"rank": 9}


def test_classification_is_data():
    table = kernel_table()
    assert table.classify("kernel", "ncclDevKernel_AllGather_RING_LL(x)") == COMMUNICATION
    assert table.classify("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float") == COMMUNICATION
    assert table.classify("gpu_memset", "Memset (Device)") == MEMORY
    assert table.classify("kernel", "void at::native::vectorized_elementwise_kernel") == COMPUTE
    assert table.classify("gpu_user_annotation", "data") is None
    assert table.collective_kind("nccl:all_gather") == "allgather"
    assert table.busbw_factor("allreduce", 8) == pytest.approx(1.75)
    assert table.busbw_factor("reduce_scatter", 8) == pytest.approx(0.875)


# ----------------------------------------------------------------------------- bad input


def test_truncated_gzip_keeps_what_was_read(tmp_path, capsys):
    data = gzip.compress(json.dumps(_synthetic_rank(0, steps=50)).encode())
    cut = tmp_path / "trace_rank0.json.gz"
    cut.write_bytes(data[: len(data) * 2 // 3])
    trace = read_trace(str(cut))
    assert trace.partial and trace.events > 0
    assert any("truncated" in p for p in trace.problems)
    assert main(["trace", str(cut)]) == exit_codes.BAD_INPUT
    assert "truncated" in capsys.readouterr().out


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("{not json", "invalid JSON"),
        ('{"traceEvents": [{"ph": "X", "ts": 1} {"ph": "X"}]}', "expected ',' or ']'"),
        ('{"traceEvents": [{"ph": "X", "ts": 1}, {"ph": "X", "na', "truncated"),
        ('{"other": 1}', "not a PyTorch profiler trace"),
    ],
)
def test_invalid_json_is_a_clear_message(tmp_path, capsys, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    try:
        trace = read_trace(str(path))
    except TraceReadError as err:
        assert message in str(err)
    else:  # events were read before the damage: a partial trace that says what is wrong
        assert trace.partial and any(message in p for p in trace.problems)
    assert main(["trace", str(path)]) == exit_codes.BAD_INPUT
    out = capsys.readouterr()
    assert message in out.err + out.out


def test_a_file_that_is_another_kind_is_named_as_what_it_is(tmp_path, capsys):
    log = tmp_path / "bad.json"
    log.write_text("hello")
    with pytest.raises(TraceReadError, match="invalid JSON"):
        read_trace(str(log))
    # Routed through the source registry, the verb says what the file is and which verb reads it.
    assert main(["trace", str(log)]) == exit_codes.BAD_INPUT
    assert "bad.json: this is a log, not a profiler trace; `torchtriage triage` reads it" in capsys.readouterr().err
    timeline = FIXTURES / "h200x1" / "formats" / "timeline.json.gz"  # export_memory_timeline, one H200
    assert main(["trace", str(timeline)]) == exit_codes.BAD_INPUT
    assert "a memory timeline (export_memory_timeline), not a profiler trace" in capsys.readouterr().err


def test_not_gzip_and_missing(tmp_path, capsys):
    bad = tmp_path / "x.json.gz"
    bad.write_bytes(b"\x1f\x8b" + b"garbage" * 10)
    assert main(["trace", str(bad)]) == exit_codes.BAD_INPUT
    assert "gzip" in capsys.readouterr().err
    assert main(["trace", str(tmp_path / "none.json")]) == exit_codes.BAD_INPUT
    assert main(["trace", str(tmp_path)]) == exit_codes.BAD_INPUT  # a folder without traces


def test_trace_without_gpu_events_or_collectives(tmp_path, capsys):
    data = {"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 10}]}
    _write(tmp_path, "trace_rank0.json", data)
    _write(tmp_path, "trace_rank1.json", data)
    assert main(["trace", str(tmp_path)]) == exit_codes.OK
    out = capsys.readouterr().out
    assert "no GPU events" in out and "no collective records" in out and "no straggler" in out


def test_large_synthetic_trace_streams(tmp_path):
    """A trace of 200k events: read with a bounded buffer, records small."""
    path = _write(tmp_path, "trace_rank0.json.gz", _synthetic_rank(0, steps=200, extra_events=200_000), gz=True)
    trace = read_trace(str(path))
    assert trace.events == 200 * 10 + 200_000
    assert len(trace.gpu_ts) == 600 and len(trace.steps) == 200


def test_traces_of_a_few_of_the_jobs_ranks_name_the_missing_ones(tmp_path, capsys):
    for rank in (0, 3):  # of a world of 4 (distributedInfo)
        _write(tmp_path, f"trace_rank{rank}.json", _synthetic_rank(rank))
    main(["trace", str(tmp_path), "--json"])
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["facts"]["missing_ranks"] == "ranks 1-2"
    assert any("traces of 2 of the job's 4 ranks: ranks 1-2 missing" in p for p in verdict["problems"])
    # Rank 3 arrives last of the two read, but among four ranks that is no proof: not "high".
    assert verdict["culprit_ranks"] == [3] and verdict["confidence"] == "medium"


def test_on_a_gpu_a_collective_is_timed_by_its_kernel_never_by_the_cpu_call(tmp_path):
    ranks = [_synthetic_rank(rank, steps=2) for rank in (0, 1)]
    # Rank 1's first all_reduce: its kernel is missing from the trace, and the CPU call that enqueued it
    # took 50 ms (the launch queue was full). That call says nothing of how long the collective waited.
    events = ranks[1]["traceEvents"]
    first_comm = next(e for e in events if e["name"] == "record_param_comms")
    first_comm["dur"] = 50_000
    ext = first_comm["args"]["External id"]
    events[:] = [e for e in events if not (e["cat"] == "kernel" and e["args"]["External id"] == ext)]
    for rank, data in zip((0, 1), ranks, strict=True):
        _write(tmp_path, f"trace_rank{rank}.json", data)
    analysis = _analyse_folder(tmp_path)
    first, second = analysis.collectives
    assert first.ranks == [0] and first.last_rank is None  # only rank 0's kernel times it
    assert set(second.ranks) == {0, 1} and max(second.durations.values()) < 1000
