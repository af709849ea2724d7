"""Secrets of the local stack, without starting it (issue 13 item 2): files are 0600 from
their creation, the storage URI is redacted in every form, role passwords reach PostgreSQL
only as SCRAM verifiers. (The running stack: tests/e2e/test_stack.py.)"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import stat

import pytest

from scarcelab.protocols.study_store import redact
from scarcelab.tracking.stack import Stack, StackState, scram_verifier


@pytest.mark.parametrize("uri,secret", [
    ("postgresql+psycopg2://optuna:s3cret@db:5432/optuna", "s3cret"),
    ("postgresql://:s3cret@db/optuna", "s3cret"),  # empty user
    ("postgresql://u:p@ss@w0rd@db/optuna", "p@ss@w0rd"),  # '@' in the password
    ("postgresql://u:a:b/c@db/optuna", "a:b/c"),
    ("postgresql://u@db/optuna?password=s3cret&sslmode=require", "s3cret"),
    ("postgresql://u@db/optuna?sslmode=require&sslpassword=s3cret", "s3cret"),
])
def test_redact_hides_the_password_in_every_form(uri, secret):
    out = redact(uri)
    assert secret not in out and "***" in out
    assert out.endswith(("optuna", "require")) or "optuna?" in out  # the rest stays readable


def test_redact_leaves_uris_without_secrets_alone():
    assert redact("sqlite:////tmp/o.db") == "sqlite:////tmp/o.db"
    assert redact("postgresql://u@db/optuna") == "postgresql://u@db/optuna"
    assert redact(None) == ""


def test_secret_files_are_0600_from_creation(tmp_path, monkeypatch):
    """With chmod out of the picture (and a permissive umask), the files that hold secrets
    are still 0600: the mode is set when the file is created, not fixed afterwards."""
    monkeypatch.setattr(os, "chmod", lambda *a, **k: None)
    old = os.umask(0o022)
    try:
        st = Stack(tmp_path / "stack")
        st._save()
        mode = stat.S_IMODE((tmp_path / "stack" / "stack.json").stat().st_mode)
        st.state.auth = True
        st._mlflow_env()
        ini = stat.S_IMODE((tmp_path / "stack" / "auth.ini").stat().st_mode)
    finally:
        os.umask(old)
    assert mode == 0o600 and ini == 0o600
    assert not list((tmp_path / "stack").glob("*.tmp"))


def test_roles_have_their_own_passwords_and_clients_never_get_the_superuser():
    s = StackState()
    assert len({s.pg_password, s.mlflow_db_password, s.optuna_password}) == 3
    env = "\n".join(s.client_env().values())
    assert s.pg_password not in env and s.mlflow_db_password not in env
    assert s.client_env()["OPTUNA_STORAGE"].startswith("postgresql+psycopg2://optuna:")
    assert s.db_uri("mlflow").startswith("postgresql+psycopg2://mlflow:")


def test_scram_verifier_matches_rfc_7677():
    """Recompute the verifier's keys from its salt (RFC 5802 §3) and compare."""
    v = scram_verifier("pencil")
    assert "pencil" not in v
    algo, rest = v.split("$", 1)
    iters_salt, keys = rest.split("$")
    iters, salt = iters_salt.split(":")
    stored, server = keys.split(":")
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", base64.b64decode(salt), int(iters))
    ck = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    assert algo == "SCRAM-SHA-256" and int(iters) == 4096
    assert base64.b64decode(stored) == hashlib.sha256(ck).digest()
    assert base64.b64decode(server) == hmac.new(salted, b"Server Key", hashlib.sha256).digest()
