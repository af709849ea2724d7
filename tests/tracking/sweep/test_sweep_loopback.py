"""An embedded Ray cluster listens on loopback only (issue 42 item 1): whoever reaches
Ray's ports runs code as the user (Ray 2.60's default token authentication aside), so no
port may be on the host's address or on ``::``. The cluster is started the way a sweep
starts it (``RayPool`` without an address), one cell runs on it (so a worker process
exists), and every listening socket of the driver and of every process under it is read from the
kernel (psutil)."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")
REPO = Path(__file__).resolve().parents[3]

SCRIPT = """
import json, os, psutil
from scarcelab.tracking.sweep.pool import RayPool

def cell():
    import os
    return os.getpid()

pool = RayPool(jobs=1)
pool.submit("cell", cell)
key, worker, err = pool.next_done()
me = psutil.Process()
out = []
for p in [me] + me.children(recursive=True):
    try:
        name = p.name()
        conns = p.net_connections(kind="inet")
    except psutil.Error:
        continue
    out += [[name, p.pid, c.laddr.ip, c.laddr.port] for c in conns
            if c.status == psutil.CONN_LISTEN]
pool.shutdown()
print("RESULT", json.dumps({"listen": out, "worker": worker, "error": repr(err)}))
"""


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(addr, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is loopback too
    return (mapped or addr).is_loopback


def test_embedded_ray_listens_on_loopback_only() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                       text=True, timeout=300, cwd=REPO)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert p.returncode == 0 and line, p.stdout[-2000:] + p.stderr[-3000:]
    got = json.loads(line[len("RESULT "):])
    assert got["error"] == "None" and isinstance(got["worker"], int), got
    names = {name for name, *_ in got["listen"]}
    # the sockets were seen at all: GCS and raylet always listen (gRPC)
    assert {"gcs_server", "raylet"} <= names, got["listen"]
    open_ = [s for s in got["listen"] if not _loopback(s[2])]
    assert not open_, f"listening beyond loopback: {open_}"


def test_a_ray_that_keeps_a_routable_node_address_is_refused() -> None:
    """The check after start: a node address that is not loopback stops the embedded
    cluster with one line instead of running cells on it."""
    from scarcelab.tracking.sweep.pool import check_loopback

    class FakeRay:
        __version__ = "9.9"
        down = False

        class util:  # noqa: N801 - stands in for the ray.util module
            @staticmethod
            def get_node_ip_address() -> str:
                return "192.0.2.7"

        def shutdown(self) -> None:
            FakeRay.down = True

    with pytest.raises(RuntimeError, match="would listen on 192.0.2.7, not on loopback"):
        check_loopback(FakeRay())
    assert FakeRay.down
    FakeRay.util.get_node_ip_address = staticmethod(lambda: "127.0.0.1")  # type: ignore[method-assign]
    FakeRay.down = False
    check_loopback(FakeRay())
    assert not FakeRay.down
