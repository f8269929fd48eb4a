"""`torchtriage memory`: the real OOM snapshot, synthetic snapshots built here, and bad input."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from torchtriage import exit_codes
from torchtriage.analysis.memory import (
    analyse_snapshot,
    build_memory_verdict,
    fold_frames,
    read_snapshot,
    snapshot_from_data,
)
from torchtriage.cli import main
from torchtriage.errors import InputError

FIXTURE = Path(__file__).parent / "fixtures" / "h200x2" / "oom_snapshot.pickle"
GIB = 1 << 30
MIB = 1 << 20


def _frames(file: str, line: int, name: str = "train_step") -> list[dict]:
    return [
        {
            "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
            "filename": "??",
            "line": 0,
        },
        {"name": "at::_ops::empty_memory_format::call(...)", "filename": "??", "line": 0},
        {"name": "forward", "filename": "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", "line": 125},
        {"name": name, "filename": file, "line": line},
    ]


def _snapshot(blocks, trace, segment_size=None):
    """One segment per block list entry (size, state, frames), and a device-0 trace."""
    segments = []
    address = 1 << 40
    for group in blocks:
        total = segment_size or sum(b[0] for b in group)
        seg_blocks, addr = [], address
        for size, state, frames in group:
            seg_blocks.append({"address": addr, "size": size, "requested_size": size, "state": state, "frames": frames})
            addr += size
        allocated = sum(b[0] for b in group if b[1] == "active_allocated")
        segments.append(
            {"device": 0, "address": address, "total_size": total, "allocated_size": allocated, "stream": 0,
             "segment_type": "large", "blocks": seg_blocks}
        )  # fmt: skip
        address += total + (1 << 30)
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {"expandable_segments": False}}


def _write(tmp_path: Path, data, name="snap.pickle") -> str:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(data, protocol=4))
    return str(path)


def test_real_oom_snapshot_request_free_and_top_site():
    report = analyse_snapshot(read_snapshot(str(FIXTURE)))
    device = report.primary
    assert device.device == 0
    assert device.oom["requested"] == 16 * GIB
    assert device.oom["device_free"] == 12118523904  # 11.29 GiB, as the OOM message says
    assert device.allocated == device.reserved == 128 * GIB
    assert device.peak_allocated == 128 * GIB
    top = device.top_sites(1)[0]
    assert top.site == "/workspace/lab/oom_case.py:6 in <module>"
    assert top.bytes == 128 * GIB and top.count == 8
    verdict = build_memory_verdict(report)
    assert verdict.category == "oom" and verdict.confidence == "high"
    assert "16.00 GiB" in verdict.summary and "oom_case.py:6" in verdict.summary
    titles = [a.title for a in verdict.actions]
    assert any(t.startswith("Recompute activations") for t in titles) and any(t.startswith("Shard") for t in titles)
    assert not any(a.env for a in verdict.actions)  # nothing is fragmented: 0 B reserved-unallocated


def test_cli_json_and_exit_code(capsys):
    assert main(["memory", str(FIXTURE), "--json"]) == exit_codes.PROBLEM_FOUND
    data = json.loads(capsys.readouterr().out)
    assert data["category"] == "oom"
    assert data["facts"]["devices"][0]["oom"]["requested"] == 16 * GIB


def test_fold_frames_prefers_user_code():
    assert fold_frames(_frames("/home/me/train.py", 42))[0] == "/home/me/train.py:42 in train_step"
    only_lib = _frames("/venv/lib/python3.11/site-packages/torch/optim/adamw.py", 7)
    assert fold_frames(only_lib)[0].startswith("/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py:125")
    assert fold_frames(_frames("x", 1)[:2])[0].startswith("aten::empty_memory_format")
    assert fold_frames([])[0] == "(no stack recorded)"


def test_fragmentation_triggers_expandable_segments(tmp_path):
    act, a = _frames("/w/model.py", 10), _frames("/w/model.py", 20)
    blocks = [
        [(100 * MIB, "active_allocated", act), (400 * MIB, "inactive", [])],
        [(100 * MIB, "active_allocated", a), (400 * MIB, "inactive", [])],
    ]
    trace = [
        {"action": "alloc", "addr": 1, "size": 100 * MIB, "frames": act},
        {"action": "oom", "size": 600 * MIB, "device_free": 10 * MIB, "frames": a},
    ]
    verdict = build_memory_verdict(analyse_snapshot(read_snapshot(_write(tmp_path, _snapshot(blocks, trace)))))
    assert verdict.category == "oom"
    assert verdict.actions[0].title == "Let the allocator grow segments instead of fragmenting them"
    assert verdict.actions[0].env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert any(f.kind == "memory.fragmentation" for f in verdict.findings)


def test_peak_from_history_and_sites_at_peak(tmp_path):
    act, wts = _frames("/w/model.py", 10, "forward"), _frames("/w/init.py", 3, "build")
    trace = [
        {"action": "alloc", "addr": 100, "size": 3 * GIB, "frames": act},  # activations
        {"action": "alloc", "addr": 200, "size": GIB, "frames": act},
        {"action": "free_requested", "addr": 100, "size": 3 * GIB, "frames": []},
        {"action": "free_completed", "addr": 100, "size": 3 * GIB, "frames": []},
        {"action": "free_completed", "addr": 200, "size": GIB, "frames": []},
    ]
    # 2 GiB of weights allocated before the history began, still alive.
    data = _snapshot([[(2 * GIB, "active_allocated", wts), (4 * GIB, "inactive", [])]], trace)
    report = analyse_snapshot(snapshot_from_data(data))
    device = report.primary
    assert device.allocated == 2 * GIB and device.reserved == 6 * GIB
    assert device.peak_allocated == 6 * GIB and device.reference == "peak"
    sites = {s.site: s.bytes for s in device.top_sites()}
    assert sites == {"/w/model.py:10 in forward": 4 * GIB, "/w/init.py:3 in build": 2 * GIB}
    verdict = build_memory_verdict(report)
    assert verdict.category != "oom"


def test_compare_names_what_grew(tmp_path, capsys):
    leak = _frames("/w/cache.py", 5, "remember")
    before = _snapshot([[(GIB, "active_allocated", leak)]], [])
    after = _snapshot([[(GIB, "active_allocated", leak)], [(3 * GIB, "active_allocated", leak)]], [])
    a, b = _write(tmp_path, before, "a.pickle"), _write(tmp_path, after, "b.pickle")
    assert main(["memory", a, "--compare", b, "--json"]) == exit_codes.PROBLEM_FOUND
    data = json.loads(capsys.readouterr().out)
    assert data["facts"]["sites"][0] == {"site": "/w/cache.py:5 in remember", "before": GIB, "after": 4 * GIB,
                                         "delta": 3 * GIB}  # fmt: skip


def test_old_formats_are_tolerated(tmp_path):
    frames = _frames("/w/a.py", 1)
    # torch 2.0: stacks in the block's history
    old = {"segments": [{"device": 0, "address": 0, "total_size": GIB, "stream": 0, "segment_type": "large",
                         "blocks": [{"size": GIB, "state": "active_allocated",
                                     "history": [{"addr": 0, "real_size": GIB, "frames": frames}]}]}]}  # fmt: skip
    report = analyse_snapshot(read_snapshot(_write(tmp_path, old)))
    assert report.format == "torch-2.0"
    assert report.primary.top_sites(1)[0].site == "/w/a.py:1 in train_step"
    assert any("no allocation history" in p for p in report.problems)
    # torch 1.x memory_snapshot(): a bare list of segments
    bare = analyse_snapshot(read_snapshot(_write(tmp_path, old["segments"], "bare.pickle")))
    assert bare.format == "segments-only" and bare.primary.reserved == GIB


@pytest.mark.parametrize(
    "data, message",
    [
        ({"version": 99, "blob": [1, 2]}, "not a CUDA memory snapshot"),
        ({"segments": {"a": 1}}, "unknown snapshot format"),
        ({"segments": [], "device_traces": {"a": 1}}, "unknown snapshot format"),
        ({"segments": 5, "device_traces": [[]]}, "unknown snapshot format"),
        ({"segments": [], "device_traces": [5]}, "per-device lists"),
        ({"segments": [1]}, "not a CUDA memory snapshot"),
        ([1, 2, 3], "not a list of allocator segments"),
        ("hello", "not a CUDA memory snapshot"),
    ],
)
def test_other_versions_and_shapes_are_refused_clearly(tmp_path, capsys, data, message):
    assert main(["memory", _write(tmp_path, data)]) == exit_codes.BAD_INPUT
    assert message in capsys.readouterr().err


def test_hostile_pickle_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [Evil()]}))
    assert main(["memory", str(path)]) == exit_codes.BAD_INPUT
    assert "refused" in capsys.readouterr().err
    assert not marker.exists()


def test_truncated_empty_and_missing(tmp_path, capsys):
    data = FIXTURE.read_bytes()
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(data[: len(data) // 2])
    assert main(["memory", str(cut)]) == exit_codes.BAD_INPUT
    assert "truncated" in capsys.readouterr().err
    (tmp_path / "empty.pickle").write_bytes(b"")
    assert main(["memory", str(tmp_path / "empty.pickle")]) == exit_codes.BAD_INPUT
    assert main(["memory", str(tmp_path / "nope.pickle")]) == exit_codes.BAD_INPUT
    with pytest.raises(InputError, match="JSON"):
        (tmp_path / "t.json").write_text("{}")
        read_snapshot(str(tmp_path / "t.json"))


def test_large_synthetic_snapshot_keeps_exact_sites(tmp_path):
    """200k history events and 20k live blocks: the peak and the sites stay exact."""
    sites = [_frames(f"/w/layer{i}.py", i) for i in range(50)]
    trace, live = [], []
    for i in range(100_000):
        frames = sites[i % 50]
        # Blocks that stay alive sit where _snapshot lays them out; freed ones anywhere else.
        addr = (1 << 40) + len(live) * MIB if i % 5 == 0 else (1 << 50) + i
        trace.append({"action": "alloc", "addr": addr, "size": MIB, "frames": frames, "time_us": i})
        if i % 5:
            trace.append({"action": "free_completed", "addr": addr, "size": MIB, "frames": [], "time_us": i})
        else:
            live.append((MIB, "active_allocated", frames))
    data = _snapshot([live], trace)
    path = _write(tmp_path, data)
    del data, trace
    report = analyse_snapshot(read_snapshot(path))
    device = report.primary
    assert device.allocated == 20_000 * MIB
    assert device.peak_allocated == 20_001 * MIB  # the last freed block was alive at the peak
    assert sum(s.bytes for s in device.sites.values()) == device.reference_bytes
    assert len(device.sites) == 11  # the 10 sites whose blocks stay alive, and the one alive at the peak


def test_html_timeline_and_sites(tmp_path, capsys):
    html = tmp_path / "m.html"
    assert main(["memory", str(FIXTURE), "--html", str(html)]) == exit_codes.PROBLEM_FOUND
    assert "HTML report" in capsys.readouterr().out
    page = html.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page.lower() and "http" not in page
    assert 'aria-label="allocation timeline"' in page and "<polygon" in page and "OOM (16.00 GiB requested)" in page
    assert "bytes by site" in page and "oom_case.py:6" in page


def test_html_compare_and_hostile_site_names(tmp_path, capsys):
    hostile = "<script>alert(1)</script>.py"
    blocks = [[(64 * MIB, "active_allocated", _frames(hostile, 3))]]
    trace = [{"action": "alloc", "addr": 1 << 40, "size": 64 * MIB, "frames": _frames(hostile, 3)}]
    before, after = tmp_path / "a.pickle", tmp_path / "b.pickle"
    before.write_bytes(pickle.dumps(_snapshot(blocks, trace)))
    after.write_bytes(pickle.dumps(_snapshot(blocks + blocks, trace)))
    html = tmp_path / "m.html"
    main(["memory", str(before), "--compare", str(after), "--html", str(html)])
    capsys.readouterr()
    page = html.read_text(encoding="utf-8")
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;.py" in page
    assert page.count('aria-label="allocation timeline"') == 2  # both snapshots drawn


def test_html_timeline_keeps_the_peak_of_a_long_history(tmp_path):
    from torchtriage.report.html import memory_series

    n = 20_000
    trace = []
    for i in range(n):
        size = GIB if i == 12_345 else MIB
        trace.append({"action": "alloc", "addr": (1 << 40) + i, "size": size, "frames": []})
        trace.append({"action": "free_completed", "addr": (1 << 40) + i, "size": size, "frames": []})
    snapshot = snapshot_from_data(_snapshot([[(MIB, "inactive", [])]], trace))
    device = analyse_snapshot(snapshot).devices[0]
    series = memory_series(snapshot, device, points=500)
    assert len(series["index"]) <= 501
    assert max(series["allocated"]) == device.peak_allocated == GIB
