"""Issue 43 §1: the stack's SeaweedFS configuration, checked without starting it (the e2e
tests in tests/e2e/test_stack.py start it): loopback, every port distinct and recorded, one
generated read-write identity, JWT keys for the internal APIs, secret files 0600, no
telemetry, and where ``weed`` comes from."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from scarcelab.tracking.stack import GRPC_OFFSET, STORE_PORTS, Stack, StackError


def _options(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def test_store_options_bind_loopback_and_record_every_port(tmp_path: Path) -> None:
    st = Stack(tmp_path / "stack")
    opts = _options(st._store_config(st._store_ports()))
    saved = json.loads(st.state_file.read_text())
    assert opts["ip.bind"] == "127.0.0.1" and opts["ip"] == "127.0.0.1"
    assert set(saved["store_ports"]) == set(STORE_PORTS)
    ports = [int(v) for k, v in opts.items() if k.endswith(("port", "port.grpc"))
             and not k.startswith(("s3.port.iceberg", "s3.port.lance"))]
    assert sorted(ports) == sorted([saved["s3_port"], *saved["store_ports"].values()])
    assert len(set(ports)) == len(ports), "two components on one port"
    assert saved["store_ports"]["admin"] + GRPC_OFFSET not in ports  # weed dials admin+10000
    assert opts["master.telemetry"] == "false" and opts["webdav"] == "false"
    assert opts["s3.port.iceberg"] == opts["s3.port.lance"] == "0"
    assert opts["admin.ui"] == "false" and opts["bucket"] == "scarcelab"
    assert opts["dir"] == str(st.s3_dir) and opts["master.dir"] == str(st.s3_dir / "master")
    assert opts["s3.allowedOrigins"] == st.state.tracking_uri
    # its local sockets in the stack's 0700 folder, not /tmp/seaweedfs-<name>-<port>.sock
    assert opts["s3.localSocket"] == str(st.store_conf / "s3.sock")
    assert opts["filer.localSocket"] == str(st.store_conf / "filer.sock")
    # a second start keeps the ports (the master's state is kept per port)
    again = Stack(tmp_path / "stack")
    assert again._store_ports() == saved["store_ports"]


def test_one_generated_read_write_identity_and_jwt_keys(tmp_path: Path) -> None:
    a, b = Stack(tmp_path / "a"), Stack(tmp_path / "b")
    for st in (a, b):
        st._store_config(st._store_ports())
    ident = json.loads((a.store_conf / "identities.json").read_text())["identities"]
    assert len(ident) == 1 and ident[0]["name"] != "anonymous"
    assert ident[0]["actions"] == ["Read", "Write", "List", "Tagging"]  # no Admin
    cred = ident[0]["credentials"]
    assert cred == [{"accessKey": a.state.s3_access_key, "secretKey": a.state.s3_secret_key}]
    assert a.state.s3_keys() == (a.state.s3_access_key, a.state.s3_secret_key)
    assert a.state.s3_secret_key != b.state.s3_secret_key  # per stack
    toml = (a.store_conf / "security.toml").read_text()
    for section in ("[jwt.signing]", "[jwt.signing.read]", "[jwt.filer_signing]",
                    "[jwt.filer_signing.read]"):
        assert section in toml
    for k in a.state.store_jwt_keys.values():
        assert f'key = "{k}"' in toml and k not in (b.store_conf / "security.toml").read_text()
    assert stat.S_IMODE(a.store_conf.stat().st_mode) == 0o700
    for f in ("identities.json", "security.toml", "weed.options"):
        assert stat.S_IMODE((a.store_conf / f).stat().st_mode) == 0o600, f
    # the secrets are in files, never on the command line
    assert a.state.s3_secret_key not in (a.store_conf / "weed.options").read_text()


def test_weed_comes_from_the_wheel_or_a_named_binary(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("SCARCELAB_WEED", raising=False)
    weed = Stack.weed_binary()
    assert weed.name == "weed" and os.access(weed, os.X_OK)
    monkeypatch.setenv("SCARCELAB_WEED", str(tmp_path / "nope"))
    with pytest.raises(StackError, match="SCARCELAB_WEED=.*nope is not an executable"):
        Stack.weed_binary()


def test_a_taken_port_of_a_store_with_data_is_refused(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import socket

    import scarcelab.tracking.stack as stack_mod

    monkeypatch.setattr(stack_mod, "PORT_RELEASE_S", 0.5)  # held for good, not a moment
    st = Stack(tmp_path / "s")
    ports = st._store_ports()
    (st.s3_dir / "master").mkdir(parents=True)
    (st.s3_dir / "master" / "state").write_text("x")
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports["filer"]))
        s.listen()
        with pytest.raises(StackError, match=f"filer port {ports['filer']} is already in use"):
            st._store_ports()
    # without data a taken port is simply picked again
    fresh = Stack(tmp_path / "f")
    fp = fresh._store_ports()
    with socket.socket() as s:
        s.bind(("127.0.0.1", fp["volume"]))
        s.listen()
        assert fresh._store_ports()["volume"] != fp["volume"]


def test_a_kept_port_released_a_moment_later_is_waited_for(tmp_path: Path) -> None:
    """A store stopped a moment ago can hold its ports for about a second after its
    process is gone (seen: `start` right after `stop` refused the master's port); a start
    of a store with data waits for them instead of failing."""
    import socket
    import threading

    st = Stack(tmp_path / "s")
    ports = st._store_ports()
    (st.s3_dir / "master").mkdir(parents=True)
    (st.s3_dir / "master" / "state").write_text("x")
    s = socket.socket()
    s.bind(("127.0.0.1", ports["master"]))
    s.listen()
    threading.Timer(1.0, s.close).start()
    assert st._store_ports() == ports  # the same ports, after the wait


def test_stop_removes_the_grpc_sockets_weed_leaves_in_tmp(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``weed`` puts its components' gRPC sockets in the temporary folder (no option moves
    them) and leaves them there when stopped; ``stop`` removes this stack's, and nothing
    else: not another stack's socket, not a regular file of the same name."""
    import socket
    import tempfile

    tmp = tmp_path / "t"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    st = Stack(tmp_path / "s")
    ports = st._store_ports()
    ours = [f"seaweedfs-master-grpc-{ports['master_grpc']}.sock",
            f"seaweedfs-admin-grpc-{ports['admin'] + GRPC_OFFSET}.sock",
            f"seaweedfs-s3-grpc-{ports['s3_grpc']}.sock"]
    other = "seaweedfs-master-grpc-1.sock"
    socks = []
    for name in [*ours, other]:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(tmp / name))
        socks.append(s)
    (tmp / f"seaweedfs-filer-grpc-{ports['filer_grpc']}.sock").write_text("not a socket")
    try:
        gone = st._remove_store_sockets()
    finally:
        for s in socks:
            s.close()
    assert sorted(p.name for p in gone) == sorted(ours)
    assert sorted(p.name for p in tmp.iterdir()) == sorted(
        [other, f"seaweedfs-filer-grpc-{ports['filer_grpc']}.sock"])
