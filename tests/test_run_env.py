"""The flight-recorder variables `torchtriage run` gives the job: the spellings its torch reads (torch >= 2.10 warns
on every rank for the old buffer and file names), and never one that overrides what the user set."""

from pathlib import Path

from torchtriage.cli.run import flight_recorder_env

OUT = Path("/runs/job")


def test_a_recent_torch_gets_only_the_names_it_reads_without_warning():
    added, kept = flight_recorder_env(OUT, {}, (2, 13))
    assert added == {
        "TORCH_FR_BUFFER_SIZE": "20000",
        "TORCH_FR_DUMP_TEMP_FILE": str(OUT / "fr" / "nccl_trace_rank_"),
        # dump on timeout: the new name is read from 2.15 on only
        "TORCH_FR_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }
    assert kept == []


def test_an_older_or_unknown_torch_gets_both_spellings():
    for version in ((2, 4), (0, 0)):
        added, _ = flight_recorder_env(OUT, {}, version)
        assert added["TORCH_FR_BUFFER_SIZE"] == added["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "20000"
        assert added["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == added["TORCH_FR_DUMP_TEMP_FILE"]


def test_a_value_the_user_set_under_either_spelling_is_kept_and_said():
    added, kept = flight_recorder_env(OUT, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "500"}, (2, 13))
    assert "TORCH_FR_BUFFER_SIZE" not in added  # torch reads the new name first: it would override theirs
    assert kept == ["TORCH_NCCL_TRACE_BUFFER_SIZE=500 (yours, kept; torchtriage would set 20000)"]
    added, kept = flight_recorder_env(OUT, {"TORCH_FR_BUFFER_SIZE": "20000"}, (2, 13))
    assert "TORCH_FR_BUFFER_SIZE" not in added and kept == []
