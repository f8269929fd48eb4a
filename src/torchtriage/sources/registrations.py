"""Where each rank's debug server said it runs: `registrations.json` of `diagnose --store`.

Every rank's debug-server worker registers its URL in the job's store as `http://<its host>:<port>` (torch's
`start_debug_server`, and `torchtriage run --debug-server`, take the host from the rank's own `gethostname()`).
The collector (collect/debug_server.py) keeps the host of each rank's registration beside the answers it
fetched, grouped by host; here that record becomes rank -> host. The record was made from what a job's store
held: every host and rank is checked as it is read, and what is not what it should be is left out.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from torchtriage.protocol import write_whole
from torchtriage.sources import limits
from torchtriage.sources.fields import as_int, strict_json
from torchtriage.sources.streams import read_whole

REGISTRATIONS_FILE = "registrations.json"
REGISTRATIONS_SCHEMA = "torchtriage.registrations/1"
_HOST_CHARS = 255  # RFC 1035 limits a name to 253; an IPv6 address is shorter


def registered_host(url: str) -> str | None:
    """The host of a registered URL as the rank wrote it (`http://node-07:41234` -> node-07; `[fe80::1]` ->
    fe80::1), its case kept; None for what is not http://HOST[:PORT]."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return None
    if parts.scheme != "http":
        return None
    place = parts.netloc.rpartition("@")[2]
    host = place[1:].partition("]")[0] if place.startswith("[") else place.partition(":")[0]
    return _host(host)


def _host(value: object) -> str | None:
    if not isinstance(value, str) or not value or len(value) > _HOST_CHARS or not value.isprintable():
        return None
    return value if " " not in value else None


def write_registrations(folder: Path, store: str, urls: Mapping[int, str]) -> None:
    """Each registered rank's host, grouped by host (a node's ranks share one), into folder/registrations.json."""
    hosts: dict[str, list[int]] = {}
    for rank, url in sorted(urls.items()):
        host = registered_host(url)
        if host is not None:
            hosts.setdefault(host, []).append(rank)
    record = {"schema": REGISTRATIONS_SCHEMA, "store": store, "hosts": hosts}
    write_whole(folder / REGISTRATIONS_FILE, json.dumps(record) + "\n")


def read_registrations(path: str, problems: list[str]) -> dict[int, str]:
    """Rank -> the host its debug server registered, from the record at `path`; what cannot be read is added to
    `problems` (a sentence naming the file)."""
    try:
        data, _ = read_whole(path, "the debug servers' registrations")
        record = strict_json(data)
    except (OSError, ValueError) as err:
        why = getattr(err, "strerror", None) or err
        problems.append(f"{path}: the debug servers' registrations cannot be read ({why}).")
        return {}
    hosts = record.get("hosts") if isinstance(record, dict) and record.get("schema") == REGISTRATIONS_SCHEMA else None
    if not isinstance(hosts, dict):
        problems.append(f"{path}: not a record of the debug servers' registrations ({REGISTRATIONS_SCHEMA}).")
        return {}
    top = limits.active().rank
    found: dict[int, str] = {}
    for host, ranks in hosts.items():
        if _host(host) is None or not isinstance(ranks, list):
            continue
        for value in ranks[: top + 1]:
            rank = as_int(value, -1, 0, top)
            if rank >= 0:
                found.setdefault(rank, host)
    return found
