"""The pre-scan (sources/pickle_scan.py) bounds what a pickle would build before the C unpickler builds it:
every fragment family of the hostile grammar (tests/hostile_pickles.py) is refused with the bound it passes,
and every genuine recording passes."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest

from conftest import FIXTURES
from hostile_pickles import cycle, deep, ladder, laughs
from torchtriage.sources import limits
from torchtriage.sources.limits import LimitExceeded
from torchtriage.sources.pickle_scan import check_key, scan
from torchtriage.sources.safe_pickle import PickleCorrupt, safe_loads


def _pickle(fragment: bytes) -> bytes:
    return b"\x80\x02" + fragment + b"."


def _genuine() -> list[Path]:
    found = []
    for root in (FIXTURES,):
        found += [p for p in root.rglob("*") if p.is_file() and ("trace_rank" in p.name and "json" not in p.name)]
        found += [p for p in root.rglob("*.pickle*") if p.is_file()]
    return sorted(found)


def test_every_genuine_recording_passes():
    files = _genuine()
    assert len(files) >= 40
    for path in files:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
        if raw[:1] == b"\x80":
            scan(raw, path.name)


@pytest.mark.parametrize("seed", range(40))
def test_deep_nesting_of_every_family_is_refused_by_depth(seed):
    detail, fragment = deep(random.Random(seed), base=0)
    with pytest.raises(LimitExceeded) as refused:
        scan(_pickle(fragment))
    assert refused.value.limit_name == "depth", detail
    assert "nests containers more than 200 deep" in str(refused.value) and "--limit depth=800" in str(refused.value)


@pytest.mark.parametrize("seed", range(40))
def test_shared_references_are_refused_by_what_they_expand_to(seed):
    detail, fragment = laughs(random.Random(seed), base=0)
    with pytest.raises(LimitExceeded) as refused:
        scan(_pickle(fragment))
    assert refused.value.limit_name == "expansion", detail


def test_a_list_ladder_is_refused_and_a_shared_string_is_not():
    rng = random.Random(3)
    refused = passed = 0
    for _ in range(30):
        detail, fragment = ladder(rng, base=0)
        try:
            scan(_pickle(fragment))
            passed += detail.startswith("string")  # strings are leaves: shared, never copied
        except LimitExceeded as err:
            refused += err.limit_name == "expansion" and detail.startswith("list ladder 1000^")
    assert refused and passed and refused + passed == 30


def test_a_container_that_holds_itself_is_refused():
    for seed in range(6):
        with pytest.raises(PickleCorrupt, match="holds itself"):
            scan(_pickle(cycle(random.Random(seed), base=0)[1]))


def test_memo_slots_and_integers_are_bounded():
    with pytest.raises(PickleCorrupt, match="memo slot 4,294,967,280"):
        scan(_pickle(b"K\x01r\xf0\xff\xff\xff"))
    with pytest.raises(PickleCorrupt, match="an integer of 2,097,152 bytes"):
        scan(_pickle(b"\x8b\x00\x00\x20\x00" + b"\x01" * (1 << 21)))
    scan(_pickle(b"\x8a\x08" + b"\xff" * 8))  # a 64-bit number


def test_the_limits_are_the_policys_and_raising_them_lets_a_pickle_through():
    nested = _pickle(b"K\x00" + b"\x85" * 300)
    with pytest.raises(LimitExceeded):
        scan(nested)
    with limits.using(limits.parse_limit("depth=400")):
        scan(nested)
        assert safe_loads(nested) is not None
    wide = _pickle(b"K\x00r\x00\x00\x00\x00" + b"(" + b"j\x00\x00\x00\x00" * 1000 + b"l")
    scan(wide)
    with limits.using(limits.parse_limit("expansion=500")), pytest.raises(LimitExceeded, match="expansion=2000"):
        scan(wide)


def test_the_restricted_unpickler_scans_before_it_builds():
    with pytest.raises(LimitExceeded):
        safe_loads(_pickle(b"}" + b"K\x00" + b"\x85" * 1_000_000 + b"K\x01s"))  # hashed as a key: SIGSEGV unscanned


def test_a_key_built_by_the_streaming_reader_is_measured_by_identity():
    level = (0,)
    for _ in range(60):
        level = (level, level)  # 2^60 as a tree, 60 objects
    with pytest.raises(LimitExceeded, match="expands"):
        check_key(level)
    check_key(((1, 2), (3, (4,))))
    chain = (0,)
    for _ in range(300):
        chain = (chain,)
    with pytest.raises(LimitExceeded, match="deep"):
        check_key(chain)
