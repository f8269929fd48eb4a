"""What a live capture's summary.json says of the ranks it could not find: the ranks of its node's block with no
process are gone (died or exited); ranks of other nodes were never looked for."""

import json

from torchtriage.sources.captures import gone_ranks, read_capture


def summary(tmp_path, processes, name="summary.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"schema": "torchtriage.dump", "host": "node-a", "processes": processes}))
    return read_capture(str(path))


def proc(rank, local_rank, world=8, local_world=4, pid=100):
    return {"rank": rank, "local_rank": local_rank, "world_size": world, "local_world_size": local_world, "pid": pid}


def test_a_rank_of_the_nodes_block_without_a_process_is_gone(tmp_path):
    capture = summary(tmp_path, [proc(4, 0), proc(5, 1), proc(7, 3)])
    assert capture.expected == frozenset({4, 5, 6, 7})
    gone = gone_ranks([capture])
    assert list(gone) == [6] and "node-a" in gone[6] and "4-7" in gone[6]


def test_the_ranks_of_other_nodes_are_not_gone(tmp_path):
    assert gone_ranks([summary(tmp_path, [proc(r, r) for r in range(4)])]) == {}


def test_without_the_local_world_size_only_a_gap_in_the_block_is_gone(tmp_path):
    processes = [{"rank": r, "local_rank": r, "world_size": 8, "pid": 1} for r in (0, 1, 3)]
    assert list(gone_ranks([summary(tmp_path, processes)])) == [2]


def test_a_crafted_count_cannot_make_a_block_of_a_billion_ranks(tmp_path):
    capture = summary(tmp_path, [proc(0, 0, world=10**12, local_world=10**9)])
    assert len(capture.expected) == 1  # an impossible count is not a count


def test_other_files_and_broken_summaries_are_not_captures(tmp_path):
    (tmp_path / "verdict.json").write_text(json.dumps({"schema": "torchtriage.verdict/1"}))
    (tmp_path / "broken.json").write_text("{")
    assert read_capture(str(tmp_path / "verdict.json")) is None
    assert read_capture(str(tmp_path / "broken.json")) is None
