"""Finding the ranks: the /proc parsing and the selection rules, on data."""

import pytest

from torchtriage import exit_codes
from torchtriage.collect.capture import file_stems
from torchtriage.collect.discovery import (
    ProcessFacts,
    RankProcess,
    is_agent,
    parse_cmdline,
    parse_environ,
    parse_stat,
    read_process,
    read_process_table,
    select_ranks,
    workers_of,
)
from torchtriage.errors import EnvironmentProblem, UsageError

PY = "/venv/bin/python3"
TORCHRUN = (PY, "/venv/bin/torchrun", "--nproc_per_node", "2", "train.py")


def proc(pid, ppid, cmdline, env=None, state="S", exe=PY):
    return ProcessFacts(pid, ppid, state, tuple(cmdline), dict(env or {}), True, exe)


def worker(pid, ppid, rank, world=2, **extra):
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), **extra}
    return proc(pid, ppid, (PY, "-u", "train.py"), env)


def table(*facts):
    return {f.pid: f for f in facts}


def one_job():
    return table(
        proc(1, 0, ("/sbin/init",), exe="/sbin/init"),
        proc(100, 1, TORCHRUN),
        worker(102, 100, 1),
        worker(101, 100, 0),
        # A DataLoader worker inherits the rank's environment: it must not pass for a rank.
        proc(103, 101, (PY, "-c", "from multiprocessing.spawn import spawn_main"), {"RANK": "0", "LOCAL_RANK": "0"}),
        proc(200, 1, (PY, "unrelated.py")),
    )


def test_parse_cmdline_splits_on_nul_and_drops_the_trailing_empty_argument():
    assert parse_cmdline(b"python3\0-m\0torch.distributed.run\0train.py\0") == (
        "python3",
        "-m",
        "torch.distributed.run",
        "train.py",
    )
    assert parse_cmdline(b"") == ()


def test_parse_environ_keeps_only_the_launcher_variables():
    data = b"HOME=/root\0RANK=3\0HF_TOKEN=secret\0WORLD_SIZE=8\0LOCAL_RANK=3\0EMPTY\0"
    env = parse_environ(data)
    assert env == {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3"}
    assert "secret" not in repr(env)


def test_parse_stat_reads_past_a_command_name_with_spaces_and_parentheses():
    assert parse_stat(b"4242 (pt_main (thread) x) S 4200 4242 4242 0 -1 4194560") == ("S", 4200)
    assert parse_stat(b"7 (python3) Z 1 7 7") == ("Z", 1)
    with pytest.raises(ValueError):
        parse_stat(b"garbage")


@pytest.mark.parametrize(
    "cmdline, expected",
    [
        (TORCHRUN, True),
        (("/venv/bin/torchrun", "train.py"), True),
        ((PY, "-m", "torch.distributed.run", "--nproc_per_node=8", "train.py"), True),
        ((PY, "-m", "torch.distributed.launch", "train.py"), True),
        ((PY, "-mtorch.distributed.run", "train.py"), True),
        (("timeout", "600", "torchrun", "train.py"), False),  # a wrapper: argv[1] is "600"
        ((PY, "-u", "train.py"), False),
        ((PY, "train.py", "--launcher", "torchrun"), False),
        (("bash", "-c", "torchrun --nproc_per_node 2 train.py"), False),
        ((), False),
    ],
)
def test_is_agent(cmdline, expected):
    assert is_agent(cmdline) is expected


def test_default_discovery_takes_the_agents_workers_in_rank_order_and_not_their_children():
    ranks = select_ranks(one_job(), "node7")
    assert [(r.rank, r.pid, r.local_rank, r.world_size, r.agent_pid, r.host) for r in ranks] == [
        (0, 101, 0, 2, 100, "node7"),
        (1, 102, 1, 2, 100, "node7"),
    ]


def test_an_agent_pid_expands_to_its_workers_and_a_worker_pid_is_taken_as_is():
    assert [r.pid for r in select_ranks(one_job(), "h", pids=[100])] == [101, 102]
    (only,) = select_ranks(one_job(), "h", pids=[102])
    assert (only.rank, only.agent_pid) == (1, None)


def test_ranks_come_from_the_launchers_variables_when_rank_is_unset():
    facts = table(
        proc(10, 1, (PY, "train.py"), {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "16"}),
        proc(11, 1, (PY, "train.py"), {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"}),
        proc(12, 1, (PY, "train.py"), {"PMI_RANK": "7", "PMI_SIZE": "8"}),
        # mp.spawn sets RANK inside the process: /proc shows only the environment it started with.
        proc(13, 1, (PY, "-c", "from multiprocessing.spawn import spawn_main")),
    )
    ranks = {r.pid: (r.rank, r.local_rank, r.world_size) for r in select_ranks(facts, "h", pids=[10, 11, 12, 13])}
    assert ranks == {10: (5, 1, 16), 11: (2, None, 4), 12: (7, None, 8), 13: (None, None, None)}


def test_rank_beats_slurm_procid_under_srun_plus_torchrun():
    facts = table(worker(10, 1, 3, SLURM_PROCID="0"))
    assert select_ranks(facts, "h", pids=[10])[0].rank == 3


def test_a_dead_or_zombie_pid_is_a_usage_error_naming_it():
    facts = one_job() | table(proc(300, 1, (PY, "x.py"), state="Z"))
    for pid in (99999, 300):
        with pytest.raises(UsageError, match=f"--pid {pid}: no such process") as err:
            select_ranks(facts, "h", pids=[pid])
        assert err.value.exit_code == exit_codes.USAGE


def test_an_agent_without_workers_is_a_usage_error():
    with pytest.raises(UsageError, match="torchrun agent with no worker"):
        select_ranks(table(proc(100, 1, TORCHRUN)), "h", pids=[100])


def test_no_job_found_is_an_environment_problem_that_says_how_to_use_pid():
    facts = table(proc(1, 0, ("/sbin/init",)), proc(200, 1, (PY, "unrelated.py")))
    with pytest.raises(EnvironmentProblem, match="--pid") as err:
        select_ranks(facts, "h")
    assert err.value.exit_code == exit_codes.ENVIRONMENT


def test_two_jobs_are_listed_and_the_user_asked_to_choose():
    facts = one_job() | table(proc(500, 1, TORCHRUN), worker(501, 500, 0), worker(502, 500, 1))
    with pytest.raises(UsageError, match="found 2 torchrun jobs") as err:
        select_ranks(facts, "h")
    assert "agent 100" in str(err.value) and "agent 500" in str(err.value)
    assert [r.pid for r in select_ranks(facts, "h", pids=[500])] == [501, 502]


def test_a_slurm_capture_step_takes_its_own_jobs_agent_on_a_shared_node():
    # Two jobs' agents on one node; the capture step runs inside job 77 (srun --overlap --jobid 77).
    job = {"SLURM_JOB_ID": "77", "SLURM_NODEID": "3"}
    facts = table(
        proc(100, 1, TORCHRUN, job), worker(101, 100, 0), worker(102, 100, 1),
        proc(500, 1, TORCHRUN, {"SLURM_JOB_ID": "91", "SLURM_NODEID": "0"}), worker(501, 500, 0),
    )  # fmt: skip
    assert [r.pid for r in select_ranks(facts, "h", place=job)] == [101, 102]
    with pytest.raises(EnvironmentProblem, match="found no torchrun workers"):
        select_ranks(facts, "h", place={"SLURM_JOB_ID": "12"})
    # An agent that says nothing of SLURM is another's: SLURM sets the job id in every process of a job, so
    # `--slurm 77` never captures a job started outside it in job 77's place; the error names what is there.
    with pytest.raises(EnvironmentProblem, match="found no torchrun workers of SLURM_JOB_ID=77.*agent 100"):
        select_ranks(one_job(), "h", place=job)


def test_a_wrapper_that_looks_like_an_agent_yields_to_the_real_agent_below_it():
    facts = table(
        proc(50, 1, ("/usr/bin/torchrun-wrapper", "/venv/bin/torchrun", "train.py"), exe="/usr/bin/bash"),
        proc(100, 50, TORCHRUN),
        worker(101, 100, 0),
        worker(102, 100, 1),
    )
    assert [(r.pid, r.agent_pid) for r in select_ranks(facts, "h")] == [(101, 100), (102, 100)]


def test_no_python_wrapper_is_looked_through_to_the_python_process():
    facts = table(
        proc(100, 1, TORCHRUN),
        proc(101, 100, ("bash", "run.sh"), {"RANK": "0", "LOCAL_RANK": "0"}, exe="/usr/bin/bash"),
        worker(110, 101, 0),
    )
    assert [w.pid for w in workers_of(100, facts)] == [110]


def test_exited_workers_and_excluded_pids_are_skipped():
    zombie = proc(104, 100, (PY, "train.py"), {"RANK": "2", "LOCAL_RANK": "2"}, state="Z")
    facts = one_job() | table(zombie)
    assert [r.pid for r in select_ranks(facts, "h")] == [101, 102]
    assert [r.pid for r in select_ranks(one_job(), "h", exclude=[102])] == [101]


def rp(pid, rank, world=None):
    return RankProcess(pid, rank, None, world, "h", ())


def test_file_stems_pad_to_the_world_size_and_disambiguate():
    assert file_stems([rp(1, 0, 2), rp(2, 1, 2)]) == {1: "rank00", 2: "rank01"}
    assert file_stems([rp(1, 7, 128)]) == {1: "rank007"}
    assert file_stems([rp(1, 0), rp(2, 0), rp(3, None)]) == {1: "rank00-pid1", 2: "rank00-pid2", 3: "pid3"}


def write_proc(root, pid, stat, cmdline, environ):
    d = root / str(pid)
    d.mkdir()
    (d / "stat").write_bytes(stat)
    (d / "cmdline").write_bytes(cmdline)
    (d / "environ").write_bytes(environ)


def test_the_proc_reader_on_a_fake_proc_tree(tmp_path):
    write_proc(tmp_path, 100, b"100 (torchrun) S 1 100", "\0".join(TORCHRUN).encode() + b"\0", b"PATH=/bin\0")
    write_proc(tmp_path, 101, b"101 (python3) S 100 100", b"python3\0train.py\0", b"RANK=0\0LOCAL_RANK=0\0")
    (tmp_path / "self").mkdir()  # not a pid: ignored
    facts = read_process_table(tmp_path)
    assert sorted(facts) == [100, 101]
    assert facts[101].env == {"RANK": "0", "LOCAL_RANK": "0"} and facts[101].ppid == 100
    assert read_process(424242, tmp_path) is None  # gone while we read
    assert [r.pid for r in select_ranks(facts, "h")] == [101]


def test_an_unreadable_proc_is_an_environment_problem(tmp_path):
    with pytest.raises(EnvironmentProblem, match="cannot list"):
        read_process_table(tmp_path / "missing")
    with pytest.raises(EnvironmentProblem, match="procfs"):
        read_process_table(tmp_path)
