"""Whether ptrace can work, decided from the facts: every Yama scope x capability case, and the readers."""

import pytest

from torchtriage import exit_codes
from torchtriage.collect.preflight import (
    PtraceFacts,
    TargetFacts,
    check_ptrace,
    decide,
    has_capability,
    parse_status_field,
    read_facts,
)
from torchtriage.errors import EnvironmentProblem

NS = "pid:[4026531836]"


def facts(scope, cap, *, uid=1000, targets=None, ancestor=False):
    targets = targets if targets is not None else (TargetFacts(10, 1000, NS),)
    return PtraceFacts(scope, cap, uid, NS, tuple(targets), ancestor)


# scope None is a kernel without Yama: the classic rules (same uid, or the capability).
@pytest.mark.parametrize(
    "scope, cap, allowed",
    [
        (None, False, True),
        (None, True, True),
        (0, False, True),
        (0, True, True),
        (1, False, False),
        (1, True, True),
        (2, False, False),
        (2, True, True),
        (3, False, False),
        (3, True, False),
    ],
)
def test_yama_scope_by_capability(scope, cap, allowed):
    decision = decide(facts(scope, cap))
    assert decision.allowed is allowed
    if not allowed:
        assert f"ptrace_scope is {scope}" in decision.reason
        assert decision.fix


def test_scope_1_allows_a_tracer_that_is_the_targets_ancestor():
    assert decide(facts(1, False, ancestor=True)).allowed


@pytest.mark.parametrize("scope", [1, 2])
def test_the_fix_for_a_missing_capability_names_cap_add(scope):
    fix = decide(facts(scope, False)).fix
    assert "--cap-add=SYS_PTRACE" in fix
    assert ("ptrace_scope=0" in fix) is (scope == 1)  # lowering the scope to 0 only helps from 1


def test_scope_3_cannot_be_fixed_without_a_reboot():
    assert "reboot" in decide(facts(3, True)).reason


@pytest.mark.parametrize("scope", [None, 0])
def test_another_users_process_needs_the_capability(scope):
    other = (TargetFacts(10, 1000, NS), TargetFacts(11, 0, NS))
    refused = decide(facts(scope, False, targets=other))
    assert not refused.allowed and "pid 11 (uid 0)" in refused.reason and "pid 10" not in refused.reason
    assert decide(facts(scope, True, targets=other)).allowed


def test_another_pid_namespace_is_a_note_not_a_refusal():
    decision = decide(facts(0, False, targets=(TargetFacts(10, 1000, "pid:[4026532178]"),)))
    assert decision.allowed
    assert any("another pid namespace" in note and "kubectl exec" in note for note in decision.notes)
    assert decide(facts(0, False)).notes == ()


def test_status_fields_and_capability_bits():
    status = "Name:\tpython3\nUid:\t1000\t1000\t1000\t1000\nCapEff:\t00000000a80425fb\n"
    assert parse_status_field(status, "Uid") == "1000\t1000\t1000\t1000"
    assert parse_status_field(status, "Missing") is None
    assert not has_capability("00000000a80425fb", 19)  # docker's default set: no SYS_PTRACE
    assert has_capability("00000000a80c25fb", 19)  # the same with --cap-add=SYS_PTRACE
    assert has_capability("000001ffffffffff", 19)
    assert not has_capability(None, 19)


def fake_proc(root, *, scope, cap_eff, target_uid):
    (root / "self" / "ns").mkdir(parents=True)
    (root / "self" / "status").write_text(f"Name:\tpython\nCapEff:\t{cap_eff}\n")
    (root / "self" / "ns" / "pid").symlink_to(NS)
    (root / "10" / "ns").mkdir(parents=True)
    (root / "10" / "status").write_text(f"Uid:\t{target_uid}\t{target_uid}\t{target_uid}\t{target_uid}\n")
    (root / "10" / "ns" / "pid").symlink_to(NS)
    if scope is not None:
        (root / "sys" / "kernel" / "yama").mkdir(parents=True)
        (root / "sys" / "kernel" / "yama" / "ptrace_scope").write_text(f"{scope}\n")


def test_read_facts_reads_yama_capabilities_uid_and_namespace(tmp_path):
    import os

    fake_proc(tmp_path, scope=1, cap_eff="00000000a80425fb", target_uid=os.getuid())
    read = read_facts([10], tmp_path)
    assert (read.yama_scope, read.cap_sys_ptrace, read.pid_namespace) == (1, False, NS)
    assert read.targets == (TargetFacts(10, os.getuid(), NS),)
    with pytest.raises(EnvironmentProblem, match="ptrace_scope is 1") as err:
        check_ptrace([10], tmp_path)
    assert err.value.exit_code == exit_codes.ENVIRONMENT
    assert "--cap-add=SYS_PTRACE" in str(err.value)


def test_a_kernel_without_yama_reads_as_no_scope(tmp_path):
    import os

    fake_proc(tmp_path, scope=None, cap_eff="0", target_uid=os.getuid())
    assert read_facts([10], tmp_path).yama_scope is None
    assert check_ptrace([10], tmp_path).decision.allowed


def test_this_machine_reads_without_error():
    import os

    read = read_facts([os.getpid()])
    assert read.targets[0].uid == os.getuid()
