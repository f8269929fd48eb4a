"""Environment parsing and the one helper that sets variables (torchtriage.runtime.env)."""

import subprocess
import sys
from datetime import timedelta

import pytest

from torchtriage.runtime import env
from torchtriage.runtime.env import EnvWarning


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for name in ("TT_X", "TT_Y", env.NCCL_TIMEOUT_ENV, env.STORE_TIMEOUT_ENV, env.STRICT_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("raw", ["", "   ", None])
def test_empty_counts_as_unset(monkeypatch, raw):
    if raw is not None:
        monkeypatch.setenv("TT_X", raw)
    assert env.env_str("TT_X", "dflt") == "dflt"
    assert env.env_flag("TT_X", True) is True
    assert env.env_positive_float("TT_X", 7.0) == 7.0


@pytest.mark.parametrize("raw, expected", [("1", True), ("TRUE", True), ("on", True), ("0", False), ("No", False)])
def test_flags(monkeypatch, raw, expected):
    monkeypatch.setenv("TT_X", raw)
    assert env.env_flag("TT_X", not expected) is expected


def test_unrecognised_flag_warns_and_keeps_default(monkeypatch):
    monkeypatch.setenv("TT_X", "maybe")
    with pytest.warns(EnvWarning, match="TT_X='maybe' is not a boolean"):
        assert env.env_flag("TT_X", False) is False


@pytest.mark.parametrize("raw", ["abc", "0", "-5", "nan", "inf", "1e999"])
def test_bad_positive_numbers_warn_and_fall_back(monkeypatch, raw):
    monkeypatch.setenv("TT_X", raw)
    with pytest.warns(EnvWarning, match="TT_X"):
        assert env.env_positive_float("TT_X", 30.0) == 30.0


def test_positive_numbers_parse(monkeypatch):
    monkeypatch.setenv("TT_X", " 2.5 ")
    assert env.env_positive_float("TT_X", 30.0) == 2.5
    monkeypatch.setenv("TT_Y", "1.5")
    with pytest.warns(EnvWarning, match="not an integer"):
        assert env.env_positive_int("TT_Y", 4) == 4
    monkeypatch.setenv("TT_Y", "8")
    assert env.env_positive_int("TT_Y", 4) == 8


def test_timeouts_from_the_environment(monkeypatch):
    assert env.nccl_timeout() == timedelta(minutes=30)
    assert env.store_timeout() == timedelta(hours=4)
    monkeypatch.setenv(env.NCCL_TIMEOUT_ENV, "2")
    monkeypatch.setenv(env.STORE_TIMEOUT_ENV, "0.5")
    assert env.nccl_timeout() == timedelta(seconds=120)
    assert env.store_timeout() == timedelta(minutes=30)
    monkeypatch.setenv(env.NCCL_TIMEOUT_ENV, "0")  # must not disarm the watchdog
    with pytest.warns(EnvWarning, match="positive"):
        assert env.nccl_timeout() == timedelta(minutes=30)


def test_strict_default(monkeypatch):
    assert env.strict_default() is False
    monkeypatch.setenv(env.STRICT_ENV, "1")
    assert env.strict_default() is True


def test_set_env_sets_an_unset_or_empty_variable_silently(monkeypatch, recwarn):
    assert env.set_env("TT_X", 5, reason="test") == "5"
    monkeypatch.setenv("TT_Y", "")
    env.set_env("TT_Y", "a", reason="test")
    env.set_env("TT_X", "5", reason="test")  # the same value again
    assert (env.env_str("TT_X"), env.env_str("TT_Y")) == ("5", "a")
    assert not [w for w in recwarn if issubclass(w.category, EnvWarning)]


def test_set_env_keeps_a_users_different_value_and_says_so(monkeypatch):
    monkeypatch.setenv("TT_X", "user")
    with pytest.warns(EnvWarning, match=r"keeping your TT_X='user'; torchtriage would set 'ours' \(because\)"):
        assert env.set_env("TT_X", "ours", reason="because") == "user"
    assert env.env_str("TT_X") == "user"
    with pytest.warns(EnvWarning, match="overwrites TT_X='user' with 'ours'"):
        assert env.set_env("TT_X", "ours", reason="because", override=True) == "ours"
    assert env.env_str("TT_X") == "ours"


def test_aliases_respect_any_spelling_the_user_set(monkeypatch):
    monkeypatch.setenv("TT_Y", "100")
    with pytest.warns(EnvWarning, match="keeping your TT_Y='100'"):
        assert env.set_env_aliases(("TT_X", "TT_Y"), 20000, reason="r") == "100"
    assert env.env_str("TT_X") is None
    monkeypatch.delenv("TT_Y")
    env.set_env_aliases(("TT_X", "TT_Y"), 20000, reason="r")
    assert (env.env_str("TT_X"), env.env_str("TT_Y")) == ("20000", "20000")


def test_importing_the_runtime_helpers_does_not_import_torch():
    code = (
        "import sys, torchtriage\n"
        "import torchtriage.runtime.env, torchtriage.runtime.setup, torchtriage.runtime.consensus, "
        "torchtriage.runtime.fingerprint\n"
        "torchtriage.assert_rank_uniform, torchtriage.check_collectives, torchtriage.init_distributed\n"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr
