"""A memory snapshot's numbers are checked where they are read: a size below 0 or past any device's memory, an
address that is no pointer, is refused with the field named (exit 3), never turned into a verdict of "-16 GiB".
Each case is the real snapshot of an OOM (tests/fixtures/h200x2/oom_snapshot.pickle) with one field changed."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from conftest import FIXTURES, run_cli

ORIGINAL = FIXTURES / "h200x2/oom_snapshot.pickle"
GIB = 1 << 30


def _snapshot() -> dict:
    return pickle.loads(ORIGINAL.read_bytes())


def _oom_index(data: dict) -> int:
    return next(i for i, event in enumerate(data["device_traces"][0]) if event["action"] == "oom")


def _memory(tmp_path: Path, data: dict):
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    return run_cli("memory", "--json", path)


def _set_block_size(data, value):
    data["segments"][0]["blocks"][0]["size"] = value
    return "segments[0].blocks[0].size"


def _set_segment_total(data, value):
    data["segments"][0]["total_size"] = value
    return "segments[0].total_size"


def _set_oom_request(data, value):
    index = _oom_index(data)
    data["device_traces"][0][index]["size"] = value
    return f"device_traces[0][{index}].size"


def _set_event_address(data, value):
    data["device_traces"][0][0]["addr"] = value
    return "device_traces[0][0].addr"


def _set_segment_device(data, value):
    data["segments"][0]["device"] = value
    return "segments[0].device"


REFUSED = [
    (_set_block_size, -16 * GIB),
    (_set_segment_total, -16 * GIB),
    (_set_oom_request, -16 * GIB),  # the verdict of "-16 GiB"
    (_set_block_size, 1 << 62),  # past any device's memory
    (_set_event_address, -4096),
    (_set_event_address, 1 << 70),  # no pointer, and past the 64-bit column it is stored in
    (_set_segment_device, -1),
    (_set_block_size, "lots"),
]


@pytest.mark.parametrize(("change", "value"), REFUSED, ids=[f"{c.__name__}={v!r:.12}" for c, v in REFUSED])
def test_a_number_no_snapshot_holds_is_refused_with_its_field_named(tmp_path, change, value):
    data = _snapshot()
    field = change(data, value)
    done = _memory(tmp_path, data)
    said = done.stderr.decode()
    assert done.returncode == 3, (done.returncode, said, done.stdout[:300])
    assert f"its field `{field}` is " in said, said
    assert "not a memory snapshot torch wrote" in said
    assert "Traceback" not in said and not done.stdout


def test_the_unchanged_snapshot_is_an_oom_of_16_gib(tmp_path):
    done = _memory(tmp_path, _snapshot())
    verdict = json.loads(done.stdout)
    assert done.returncode == 1 and verdict["category"] == "oom"
    assert "a 16.00 GiB request" in verdict["summary"]


def test_an_oom_asking_for_more_than_any_device_holds_is_still_an_oom(tmp_path):
    """A wrong shape asks for petabytes: the OOM event records the request, which is genuine; only memory that
    was held (blocks, segments, allocations) is bounded by a device's size."""
    data = _snapshot()
    _set_oom_request(data, 1 << 60)
    done = _memory(tmp_path, data)
    verdict = json.loads(done.stdout)
    assert done.returncode == 1 and verdict["category"] == "oom", done.stderr.decode()
    assert "a 1048576.00 TiB request" in verdict["summary"]
