import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from conftest import FIXTURES, H200, run_cli
from torchtriage.analysis.nvlink import MARGINAL, OK, UNHEALTHY, analyse, classify_link, classify_xid
from torchtriage.collect import nvidia
from torchtriage.errors import EnvironmentProblem, InputError
from torchtriage.sources import nvlink as smi

NEWER = FIXTURES / "nvlink" / "b200_fec_healthy.txt"
DMESG = FIXTURES / "nvlink" / "dmesg_xids.txt"


def report_of(*paths):
    return analyse(nvidia.load_recorded([str(p) for p in paths]))


def variant(tmp_path: Path, text: str, name: str = "capture.txt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def replace_in_gpu(text: str, gpu: int, old: str, new: str, section: str = "+ nvidia-smi nvlink -e") -> str:
    """Replace the first `old` inside GPU `gpu`'s block of one section."""
    start = text.index(section)
    start = text.index(f"GPU {gpu}:", start)
    at = text.index(old, start)
    return text[:at] + new + text[at + len(old) :]


# --- real recordings -------------------------------------------------------------------------------


def test_h200_recording_older_layout_is_healthy():
    report = report_of(H200 / "nvidia_smi.txt")
    assert len(report.links) == 36 and {x.layout for x in report.links} == {"legacy"}
    assert report.status == OK
    assert [m.bus_id for m in nvidia.load_recorded([str(H200 / "nvidia_smi.txt")]).memory] == [
        "00000000:00:06.0",
        "00000000:00:07.0",
    ]


def test_h200_nvml_dump_counts_corrected_data_errors_as_information():
    report = report_of(H200 / "nvml.json")
    assert report.status == OK and len(report.links) == 36
    first = report.links[0]
    assert first.info["crc data errors"] == 96 and first.info["ecc data errors"] == 163
    assert first.counters == {"replay errors": 0, "recovery errors": 0, "crc errors": 0}


def test_newer_layout_fixture_is_healthy_and_reads_fec():
    report = report_of(NEWER)
    assert len(report.links) == 36 and {x.layout for x in report.links} == {"fec"}
    assert report.status == OK
    link = report.links[0]
    assert link.corrected_codewords == 8 and link.correction_rate < 1e-9
    assert link.info["effective ber"] == "15e-255"  # kept as text, never read as 15
    assert "raw errors lane 0" in link.info and "raw errors lane 0" not in link.counters


def test_cli_recordings_exit_0(tmp_path):
    for path in (H200 / "nvidia_smi.txt", H200 / "nvml.json", NEWER):
        done = run_cli("nvlink", "--from", path)
        assert done.returncode == 0, done.stderr.decode()
        assert b"0 unhealthy" in done.stdout
    done = run_cli("nvlink", "--from", NEWER, "--json")
    data = json.loads(done.stdout)
    assert data["schema"] == "torchtriage.verdict/1" and data["status"] == "ok" and len(data["links"]) == 36


# --- synthetic variants ----------------------------------------------------------------------------


def test_link_down_is_unhealthy(tmp_path):
    text = replace_in_gpu(NEWER.read_text(), 1, "Link 5: 53.125 GB/s", "Link 5: <inactive>", "+ nvidia-smi nvlink -s")
    done = run_cli("nvlink", "--from", variant(tmp_path, text))
    assert done.returncode == 1
    assert b"GPU 1 link  5  UNHEALTHY" in done.stdout and b"link is down (<inactive>)" in done.stdout


def test_fewer_active_links_than_peers_is_unhealthy(tmp_path):
    lines = NEWER.read_text().splitlines()
    gpu1 = False
    kept = []
    for line in lines:
        if line.startswith("GPU "):
            gpu1 = line.startswith("GPU 1:")
        if gpu1 and (line.strip().startswith("Link 16:") or line.strip().startswith("Link 17:")):
            continue
        kept.append(line)
    report = report_of(variant(tmp_path, "\n".join(kept)))
    gpu = [g for g in report.gpus if g.gpu == 1][0]
    assert gpu.status == UNHEALTHY and gpu.active_links == 16
    assert "peers have 18" in gpu.reasons[0]
    assert report.status == UNHEALTHY


@pytest.mark.parametrize(
    "counter", ["Symbol Errors", "Link recovery successful events", "Tx discards", "Malformed packet Errors"]
)
def test_a_hard_error_is_unhealthy(tmp_path, counter):
    text = replace_in_gpu(NEWER.read_text(), 0, f"Link 3: {counter}: 0", f"Link 3: {counter}: 2")
    report = report_of(variant(tmp_path, text))
    bad = [x for x in report.links if x.status != OK]
    assert [(x.gpu, x.link, x.status) for x in bad] == [(0, 3, UNHEALTHY)]
    assert bad[0].hard_errors == {counter.lower(): 2}


def test_high_fec_rate_is_marginal_and_exits_0(tmp_path):
    text = replace_in_gpu(NEWER.read_text(), 0, "Link 2: FEC Errors - 1: ", "Link 2: FEC Errors - 1: 9000000")
    done = run_cli("nvlink", "--from", variant(tmp_path, text))
    assert done.returncode == 0
    out = done.stdout.decode()
    assert "GPU 0 link  2  marginal" in out and "FEC correction rate" in out and "1 marginal" in out
    assert "GPU 0 link  1" not in out  # only flagged links by default
    assert "GPU 0 link  1" in run_cli("nvlink", "--from", variant(tmp_path, text), "--per-link").stdout.decode()


def test_deep_fec_bin_is_marginal():
    link = smi.LinkRecord(0, 0, True, "53.125 GB/s", fec_bins={0: 10**12, 1: 3, 4: 1})
    verdict = classify_link(link)
    assert verdict.status == MARGINAL and verdict.deep_fec_bins == {4: 1}


def test_fec_rate_threshold_is_strictly_above_1e_8():
    at = classify_link(smi.LinkRecord(0, 0, True, fec_bins={0: 10**8 - 1, 1: 1}))
    above = classify_link(smi.LinkRecord(0, 0, True, fec_bins={0: 10**7, 1: 1}))
    assert at.status == OK and above.status == MARGINAL


def test_older_layout_replay_is_marginal_and_recovery_unhealthy(tmp_path):
    text = (H200 / "nvidia_smi.txt").read_text()
    replay = replace_in_gpu(text, 1, "Link 4: Replay Errors: 0", "Link 4: Replay Errors: 12")
    assert [(x.link, x.status) for x in report_of(variant(tmp_path, replay)).links if x.status != OK] == [(4, MARGINAL)]
    recovery = replace_in_gpu(text, 1, "Link 4: Recovery Errors: 0", "Link 4: Recovery Errors: 1")
    assert run_cli("nvlink", "--from", variant(tmp_path, recovery)).returncode == 1


def test_nvml_link_inactive_is_unhealthy(tmp_path):
    data = json.loads((H200 / "nvml.json").read_text())
    data["gpus"][0]["links"][7]["state"] = 0
    report = report_of(variant(tmp_path, json.dumps(data), "nvml.json"))
    assert [(x.gpu, x.link) for x in report.links if x.status == UNHEALTHY] == [(0, 7)]
    assert [g.gpu for g in report.gpus if g.status == UNHEALTHY] == [0]  # 17 active links against 18


def test_memory_pending_remap_and_uncorrectable_ecc_are_unhealthy(tmp_path):
    text = (H200 / "nvidia_smi.txt").read_text()
    at = text.index("GPU 00000000:00:07.0")
    pending = "        Pending                                        : No"
    tail = text[at:].replace(pending, "        Pending   : Yes", 1)
    tail = tail.replace("DRAM Uncorrectable                         : 0", "DRAM Uncorrectable : 2", 1)
    report = report_of(variant(tmp_path, text[:at] + tail))
    gpu = [g for g in report.gpus if g.gpu == 1][0]
    assert gpu.status == UNHEALTHY
    assert any("uncorrectable ECC" in r for r in gpu.reasons) and any("remapping is pending" in r for r in gpu.reasons)


def test_xids_fatal_job_and_nonfatal(tmp_path):
    report = report_of(H200 / "nvidia_smi.txt", DMESG)
    assert [(x.xid, x.severity) for x in report.xids] == [(145, "info"), (31, "job"), (79, "fatal")]
    assert report.status == UNHEALTHY
    fatal = [f for f in report.verdict.findings if f.kind == "nvlink.xid_fatal"]
    assert "GPU 1" in fatal[0].message  # PCI:0000:00:07 is the second GPU of the capture
    calm = variant(tmp_path, DMESG.read_text().split("[ 9001")[0], "dmesg.txt")
    assert report_of(H200 / "nvidia_smi.txt", calm).status == OK
    assert classify_xid(smi.XidEvent("PCI:0000:01:00", 145, "Fatal RLW error", 1)).severity == "fatal"


# --- bad input and missing tools ---------------------------------------------------------------------


def test_unparsable_output_exits_3_without_traceback(tmp_path):
    bad = variant(tmp_path, "+ nvidia-smi nvlink -e\nGPU 0: NVIDIA B200\n\t Link 0 something odd\n")
    done = run_cli("nvlink", "--from", bad)
    assert done.returncode == 3 and b"Traceback" not in done.stderr
    assert b"cannot read line" in done.stderr
    done = run_cli("nvlink", "--from", variant(tmp_path, "hello\n", "other.txt"))
    assert done.returncode == 3 and b"no NVLink or GPU-memory data" in done.stderr
    done = run_cli("nvlink", "--from", variant(tmp_path, '{"gpus": 3}', "x.json"))
    assert done.returncode == 3 and b"gpus" in done.stderr
    assert run_cli("nvlink", "--from", tmp_path / "missing").returncode == 3


def test_no_nvml_and_no_nvidia_smi_exits_4(tmp_path):
    fake = tmp_path / "site"
    fake.mkdir()
    (fake / "pynvml.py").write_text(
        "class NVMLError(Exception):\n    pass\n\ndef nvmlInit():\n    raise NVMLError('Driver Not Loaded')\n"
    )
    env = dict(os.environ, PATH=str(tmp_path), PYTHONPATH=os.pathsep.join([str(fake), *sys.path]))
    done = subprocess.run([sys.executable, "-m", "torchtriage", "nvlink"], capture_output=True, env=env, timeout=60)
    assert done.returncode == 4, done.stderr
    assert b"Driver Not Loaded" in done.stderr and b"nvidia-smi is not on PATH" in done.stderr
    assert b"Traceback" not in done.stderr


def test_run_smi_failure_and_timeout_are_environment_problems(tmp_path, monkeypatch):
    script = tmp_path / "nvidia-smi"
    sleep = shutil.which("sleep")
    script.write_text(
        f"#!/bin/sh\nif [ \"$1\" = slow ]; then exec {sleep} 5; fi\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EnvironmentProblem, match="exit 9.*NVIDIA-SMI has failed"):
        nvidia.run_smi(["nvlink", "-s"])
    with pytest.raises(EnvironmentProblem, match="did not answer within"):
        nvidia.run_smi(["slow"], timeout=0.5)


# --- the NVML reader, against a fake pynvml built from the real dump ----------------------------------


def fake_pynvml(dump: dict) -> types.SimpleNamespace:
    class NVMLError(Exception):
        pass

    names = list(smi.NVML_DL_COUNTERS)
    fields = list(smi.NVML_FIELDS)
    calls = []

    def link_of(handle, number):
        if number >= len(handle["links"]):
            raise NVMLError("Invalid Argument")
        return handle["links"][number]

    def field_values(handle, pairs):
        calls.append(pairs)
        values = []
        for field_id, _scope in pairs:
            one = fields[field_id] == "NVML_FI_DEV_NVLINK_COUNT_FEC_HISTORY_1"
            value = types.SimpleNamespace(ullVal=5 if one else 0)
            ret = 0 if "FEC_HISTORY" in fields[field_id] or "SYMBOL" in fields[field_id] else 3
            values.append(types.SimpleNamespace(nvmlReturn=ret, value=value))
        return values

    module = types.SimpleNamespace(
        NVMLError=NVMLError,
        nvmlSystemGetDriverVersion=lambda: dump["driver"],
        nvmlSystemGetNVMLVersion=lambda: dump["nvml"],
        nvmlDeviceGetCount=lambda: len(dump["gpus"]),
        nvmlDeviceGetHandleByIndex=lambda i: dump["gpus"][i],
        nvmlDeviceGetName=lambda h: h["name"].encode(),
        nvmlDeviceGetUUID=lambda h: h["uuid"],
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=b"00000000:00:06.0"),
        nvmlDeviceGetNvLinkState=lambda h, n: link_of(h, n)["state"],
        nvmlDeviceGetNvLinkErrorCounter=lambda h, n, c: link_of(h, n)[smi.NVML_DL_COUNTERS[names[c]]],
        nvmlDeviceGetFieldValues=field_values,
        calls=calls,
    )
    for number, name in enumerate(names):
        setattr(module, name, number)
    for number, name in enumerate(fields):
        setattr(module, name, number)
    return module


def test_read_nvml_round_trips_through_the_dump_parser():
    dump = json.loads((H200 / "nvml.json").read_text())
    module = fake_pynvml(dump)
    data = smi.read_nvml(module)
    json.dumps(data)  # JSON-able
    assert data["gpus"][0]["name"] == "NVIDIA H200" and len(data["gpus"][0]["links"]) == 18
    assert all(scope == link for link, pairs in enumerate(module.calls[:18]) for _, scope in pairs)
    gpus = smi.parse_nvml_dump(data)
    link = gpus[0].links[0]
    assert link.fec_bins[1] == 5 and link.counters["symbol errors"] == 0
    assert "malformed packet errors" not in link.counters  # NOT_SUPPORTED answers are not zeros
    assert link.info["crc data errors"] == 96


def test_gather_live_falls_back_to_nvidia_smi(monkeypatch):
    text = NEWER.read_text()
    sections = smi.split_capture(text)
    outputs = {"nvlink -s": sections["nvidia-smi nvlink -s"], "nvlink -e": sections["nvidia-smi nvlink -e"]}

    def fake_run(args, timeout=30):
        key = " ".join(args)
        if key in outputs:
            return outputs[key]
        raise EnvironmentProblem("not recorded")

    def no_nvml(timeout=30):
        raise EnvironmentProblem("the NVML bindings are not installed")

    monkeypatch.setattr(nvidia, "read_nvml_live", no_nvml)
    monkeypatch.setattr(nvidia, "run_smi", fake_run)
    monkeypatch.setattr(nvidia.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(nvidia, "read_kernel_log", lambda: (DMESG.read_text(), "dmesg"))
    inputs = nvidia.gather_live()
    assert inputs.sources[0] == "nvidia-smi nvlink" and len(inputs.gpus) == 2
    assert any("memory health not read" in p for p in inputs.problems)
    assert [x.xid for x in inputs.xids] == [145, 31, 79]


def test_parsers_reject_text_before_any_gpu_header():
    with pytest.raises(InputError, match="GPU <n>"):
        smi.parse_nvlink_errors("\t Link 0: Replay Errors: 0\n")


def test_topology_matrix_from_recording():
    capture = smi.split_capture((H200 / "nvidia_smi.txt").read_text())
    matrix = smi.parse_topology(capture["nvidia-smi topo -m"])
    assert matrix == {"GPU0": {"GPU1": "NV18"}, "GPU1": {"GPU0": "NV18"}}


def test_a_gpu_is_compared_with_the_most_links_any_peer_of_its_model_has():
    """One pass per model, the same judgement as comparing each GPU with every peer: seeded random machines of
    mixed models, some GPUs alone of their model, some sharing the most links."""
    import random

    from torchtriage.analysis.nvlink import classify_gpus
    from torchtriage.sources.nvlink import GpuRecord, LinkRecord

    rng = random.Random(7)
    for _ in range(200):
        gpus = []
        for index in range(rng.randint(1, 12)):
            gpu = GpuRecord(index, rng.choice(["H100", "H200", "A100"]))
            for link in range(rng.randint(0, 6)):
                gpu.links[link] = LinkRecord(index, link, active=rng.random() < 0.8)
            gpus.append(gpu)
        active = {g.index: sum(1 for link in g.links.values() if link.active is not False) for g in gpus}
        for verdict in classify_gpus(gpus):
            peers = [active[g.index] for g in gpus if g.name == verdict.name and g.index != verdict.gpu]
            expected = UNHEALTHY if peers and active[verdict.gpu] < max(peers) else OK
            assert verdict.status == expected, (verdict, active)


def test_a_fifo_given_to_nvlink_is_named_not_read(tmp_path):
    fifo = tmp_path / "smi.txt"
    os.mkfifo(fifo)
    done = run_cli("nvlink", "--from", str(fifo))
    assert done.returncode == 3 and b"a FIFO" in done.stderr and b"Traceback" not in done.stderr
