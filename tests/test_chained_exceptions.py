"""A chained exception (Lib/traceback.py: the cause's traceback, "During handling of the above exception, another
exception occurred:" or "The above exception was the direct cause of the following exception:", then the next) is
one failure: an inner exception of no known kind is the detail of the known failure that wraps it. Logs written
from Python's traceback format and the libraries' raise statements."""

from conftest import triage_json

SITE = "/usr/local/lib/python3.9/site-packages"
REFUSED = [
    "Traceback (most recent call last):",
    f'  File "{SITE}/urllib3/connection.py", line 174, in _new_conn',
    "    conn = connection.create_connection(",
    "ConnectionRefusedError: [Errno 111] Connection refused",
]
DURING = ["", "During handling of the above exception, another exception occurred:", ""]
CAUSE = ["", "The above exception was the direct cause of the following exception:", ""]
# torch/distributed/elastic/rendezvous/etcd_rendezvous_backend.py: get_state raises RendezvousConnectionError
RDZV_CONNECTION = [
    "Traceback (most recent call last):",
    f'  File "{SITE}/torch/distributed/elastic/rendezvous/etcd_rendezvous_backend.py", line 79, in get_state',
    "    raise RendezvousConnectionError(",
    "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to etcd has failed. See "
    "inner exception for details.",
]
# python-etcd's client, called from torch's legacy etcd rendezvous: no rule knows its exception, the place does
ETCD = [
    "Traceback (most recent call last):",
    f'  File "{SITE}/torch/distributed/elastic/rendezvous/etcd_rendezvous.py", line 226, in __init__',
    '    log.info("Etcd machines: %s", self.client.machines)',
    f'  File "{SITE}/etcd/client.py", line 247, in machines',
    '    raise etcd.EtcdException("Could not get the list of servers, "',
    "etcd.EtcdException: Could not get the list of servers, maybe you provided the wrong host(s) to connect to?",
]
FAILED = [  # an exception class named ...Failed (python-etcd's EtcdConnectionFailed) ends its traceback too
    "Traceback (most recent call last):",
    f'  File "{SITE}/etcd/client.py", line 913, in wrapper',
    "    raise etcd.EtcdConnectionFailed('Connection to etcd failed due to %r' % e, cause=e)",
    "etcd.EtcdConnectionFailed: Connection to etcd failed due to MaxRetryError(...)",
]


def verdict_of(tmp_path, lines):
    path = tmp_path / "agent.log"
    path.write_text("\n".join(lines) + "\n")
    return triage_json(path)[1]


def test_an_unknown_exception_wrapped_by_a_known_failure_is_its_detail(tmp_path):
    for chain in ([*REFUSED, *CAUSE, *RDZV_CONNECTION], [*REFUSED, *DURING, *ETCD]):
        verdict = verdict_of(tmp_path, chain)
        assert verdict["category"] == "rendezvous", verdict["summary"]
    # Through several links, the one with no known kind of its own included.
    verdict = verdict_of(tmp_path, [*REFUSED, *DURING, *FAILED, *CAUSE, *RDZV_CONNECTION])
    assert verdict["findings"][0]["kind"] == "rendezvous.elastic_connection", verdict["summary"]


def test_a_known_inner_failure_keeps_its_own_kind_and_unchained_tracebacks_are_two(tmp_path):
    oom = [
        "Traceback (most recent call last):",
        '  File "/app/train.py", line 200, in main',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB.",
    ]
    assert verdict_of(tmp_path, [*oom, *DURING, *ETCD])["category"] == "oom"
    # The same two tracebacks far apart are two failures: the first, of no known kind, is not the etcd's detail.
    apart = verdict_of(tmp_path, [*REFUSED, *[f"step {i}" for i in range(20)], *ETCD])
    kinds = {(f["kind"], f["role"]) for f in apart["findings"]}
    assert ("logs.uncaught_exception", "primary") in kinds, kinds
