"""Every pod of a Kubernetes job (a PyTorchJob's, a JobSet's): the node-local capture run in each pod with
`kubectl exec`, its folder streamed back as a tar archive, the pods' folders read together as one job.

    kubectl get pods -l SELECTOR [-n NS] --field-selector=status.phase=Running \
        -o custom-columns=NAME:.metadata.name,NODE:.spec.nodeName --no-headers
    kubectl exec POD [-n NS] [-c CONTAINER] -- sh -c 'torchtriage dump --out D >&2; tar -C D/<host>-<time> -cf - .'

Each pod's folder lands in OUT/<pod>/. The archive is read as data: regular files and folders only, names
inside the pod's folder, bounded in size; anything else is refused and said. What lands is private, as any
capture (folders 0700, files 0600), whatever modes the archive gives.

The machine an operator cordons or drains is the pod's node, which the pod cannot see (its host name is the
pod's): kubectl's answer names it, and the pod's capture summary keeps it (`"kubernetes": {pod, namespace,
node}`, written here over anything of that name the archive held), so a verdict names the culprit's node.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from torchtriage.errors import EnvironmentProblem, UsageError
from torchtriage.protocol import make_private_folders, write_private, write_whole
from torchtriage.sources.captures import CAPTURE_SCHEMA, CAPTURE_SUMMARY
from torchtriage.sources.fields import strict_json
from torchtriage.sources.streams import read_whole

_POD_FOLDER = "/tmp/torchtriage-pod-capture"
_MAX_ARCHIVE = 512 << 20  # one pod's stacks are a few MB
_POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")  # DNS-1123, as Kubernetes names pods (and nodes)
_NAME_CHARS = 253  # a DNS-1123 subdomain's longest
# Each pod's name and the node it was scheduled on, one pod a line (`<none>` for a field that is not set).
_POD_COLUMNS = "custom-columns=NAME:.metadata.name,NODE:.spec.nodeName"
_SLACK_S = 60.0  # for kubectl to reach the pod and start Python there


def _kubectl() -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise EnvironmentProblem("kubectl is not on PATH: run this where kubectl reaches the cluster")
    return kubectl


def list_pods(selector: str, namespace: str | None) -> dict[str, str | None]:
    """Pod -> the node it runs on (None where kubectl did not say), for the running pods the selector matches."""
    command = [_kubectl(), "get", "pods", "-l", selector, "--field-selector=status.phase=Running"]
    command += ["-o", _POD_COLUMNS, "--no-headers"] + (["-n", namespace] if namespace else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=_SLACK_S, check=False)
    if done.returncode != 0:
        raise EnvironmentProblem(f"kubectl get pods failed: {done.stderr.strip()[-300:] or done.returncode}")
    rows = [line.split() for line in done.stdout.splitlines() if line.strip()]
    pods = {row[0].removeprefix("pod/"): _node(row[1:]) for row in rows}
    bad = [p for p in pods if not _is_name(p)]
    if bad:
        raise EnvironmentProblem(f"kubectl named pods that are not pod names: {bad[:3]}")
    if not pods:
        raise EnvironmentProblem(f"no running pod matches -l {selector}" + (f" in {namespace}" if namespace else ""))
    return pods


def _is_name(text: str) -> bool:
    return len(text) <= _NAME_CHARS and bool(_POD_NAME.fullmatch(text))


def _node(columns: list[str]) -> str | None:
    """The NODE column: a node's name, or None (`<none>`, missing, or not a name)."""
    return columns[0] if len(columns) == 1 and _is_name(columns[0]) else None


def _record_pod(folder: Path, pod: str, namespace: str | None, node: str | None) -> None:
    """Note in the pod's capture summary which pod it is and the node kubectl placed it on (over anything of that
    name the archive held: the pod says nothing of its node). A summary that is not a capture's is left as is."""
    path = folder / CAPTURE_SUMMARY
    try:
        summary = strict_json(read_whole(str(path), "the pod's capture summary")[0])
    except (OSError, ValueError):
        return
    if isinstance(summary, dict) and summary.get("schema") == CAPTURE_SCHEMA:
        summary["kubernetes"] = {"pod": pod, "namespace": namespace, "node": node}
        write_whole(path, json.dumps(summary, indent=2) + "\n")


def _extract(archive: bytes, into: Path) -> list[str]:
    """A pod's tar archive into `into`: regular files and folders under it only. The names refused."""
    refused = []
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        for member in tar.getmembers():
            name = Path(member.name)
            if name.is_absolute() or ".." in name.parts or not (member.isfile() or member.isdir()):
                refused.append(member.name)
                continue
            try:
                _extract_member(tar, member, into / name)
            except OSError:  # a file where the archive has a folder, or the reverse
                refused.append(member.name)
    return refused


def _extract_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    if member.isdir():
        make_private_folders(target)
        return
    make_private_folders(target.parent)
    source = tar.extractfile(member)
    if source is not None:
        if os.path.lexists(target):  # a name the archive repeats: its last member stands, as with tar
            target.unlink()
        write_private(target, source.read())


def _capture_pod(pod: str, node: str | None, namespace: str | None, container: str | None, dump_args: list[str],
                 folder: Path, timeout_s: float) -> str | None:  # fmt: skip
    there = f"{_POD_FOLDER}-{os.getpid()}-{time.time_ns()}"  # this capture's own folder in the pod
    inner = f"torchtriage dump --out {there} {shlex.join(dump_args)} >&2; "
    inner += f'd=$(ls -d {there}/*/ | head -n 1) && tar -C "$d" -cf - .'
    command = [_kubectl(), "exec", pod] + (["-n", namespace] if namespace else [])
    command += (["-c", container] if container else []) + ["--", "sh", "-c", inner]
    try:
        done = subprocess.run(command, capture_output=True, timeout=timeout_s + _SLACK_S, check=False)
    except subprocess.TimeoutExpired:
        return f"pod {pod}: no answer within {timeout_s + _SLACK_S:g} s"
    if not done.stdout:
        return f"pod {pod}: nothing came back ({done.stderr.decode(errors='replace').strip()[-200:]})"
    if len(done.stdout) > _MAX_ARCHIVE:
        return f"pod {pod}: its archive is over {_MAX_ARCHIVE >> 20} MB; refused"
    try:
        refused = _extract(done.stdout, folder / pod)
    except tarfile.TarError as err:
        return f"pod {pod}: what came back is not a tar archive ({err})"
    _record_pod(folder / pod, pod, namespace, node)
    return f"pod {pod}: refused {len(refused)} archive member(s), e.g. {refused[0]!r}" if refused else None


def capture_every_pod(
    selector: str, namespace: str | None, container: str | None, out: Path, timeout_s: float
) -> tuple[Path, list[str]]:
    """`dump` in every running pod the selector matches, at once; the merged folder and the problems."""
    if not selector.strip():
        raise UsageError("--pods: give a label selector, e.g. --pods training.kubeflow.org/job-name=myjob")
    pods = list_pods(selector, namespace)
    make_private_folders(out)
    args = ["--timeout", f"{timeout_s:g}"]
    with ThreadPoolExecutor(min(64, len(pods))) as pool:
        captures = [pool.submit(_capture_pod, pod, node, namespace, container, args, out, 2 * timeout_s)
                    for pod, node in pods.items()]  # fmt: skip
        problems = [capture.result() for capture in captures]
    found = [p for p in problems if p]
    if not any(out.iterdir()):
        raise EnvironmentProblem("no pod's capture came back: " + "; ".join(found[:4]))
    return out, found
