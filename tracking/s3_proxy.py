"""A SigV4-verifying reverse proxy in front of the local stack's S3 store: the store
itself checks no signature, so without it anyone who can reach the port writes artifacts.

npm's ``s3rver@3`` (the stack's store, because it persists to disk) does not check
signatures: its ``lib/middleware/authentication.js`` lets any request without an
``Authorization`` header through. So with ``scripts/stack start --auth`` s3rver listens on a
Unix socket inside a 0700 folder of the stack, and this proxy holds the public S3 port: it
checks AWS Signature Version 4 against one per-stack access key and forwards only verified
requests, re-signed with s3rver's own built-in key (``S3RVER``: s3rver refuses an access key
it does not know, and a re-signed request is exactly what the MLflow server sent it before).

What is verified (https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-authenticating-requests.html):

* header auth ``Authorization: AWS4-HMAC-SHA256 Credential=…, SignedHeaders=…, Signature=…``
  and presigned URLs (``X-Amz-Algorithm`` … query parameters, with their expiry);
* the canonical request from the method, the path as sent (S3 does not normalise or double
  encode it), the sorted canonical query, the signed headers (``host`` must be one, and so
  must every ``x-amz-*`` header present) and the payload hash;
* the payload hash: ``UNSIGNED-PAYLOAD``, or a hex SHA-256 that is checked against the body
  before anything is forwarded (the body is spooled, in memory up to 8 MiB, then on disk);
  ``STREAMING-*`` (aws-chunked) payloads are refused — their chunk signatures are not
  implemented, and botocore uses them only over HTTPS;
* ``X-Amz-Date`` within 15 minutes of the proxy's clock.

Everything else gets an S3-style XML error. Standard library only, so the stack can run it
as a plain script (``python tracking/s3_proxy.py``), keys from the environment
(``SCARCELAB_S3_ACCESS_KEY`` / ``SCARCELAB_S3_SECRET_KEY``), never from argv.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import hmac
import http.client
import os
import re
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import IO
from urllib.parse import quote, unquote

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW_S = 15 * 60
MAX_PRESIGN_EXPIRES_S = 7 * 24 * 3600
SPOOL_IN_MEMORY = 8 << 20
CHUNK = 1 << 16
UNSIGNED = "UNSIGNED-PAYLOAD"
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
              "trailer", "upgrade", "expect", "authorization"}
_AUTH_RE = re.compile(r"^AWS4-HMAC-SHA256\s+Credential=([^,\s]+)\s*,\s*SignedHeaders=([^,\s]+)"
                      r"\s*,\s*Signature=([0-9a-fA-F]{64})\s*$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class S3AuthError(Exception):
    """A request the proxy refuses; ``code``/``status`` follow S3's own error codes."""

    def __init__(self, code: str, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.code, self.status = code, status


@dataclass(frozen=True)
class Verified:
    """What a successful check found: how the body must be treated before forwarding."""

    payload_hash: str  # UNSIGNED-PAYLOAD or the hex SHA-256 the body must have
    presigned: bool


def _sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    k = _hmac(("AWS4" + secret).encode(), date)
    k = _hmac(k, region)
    k = _hmac(k, service)
    return _hmac(k, "aws4_request")


def _enc(s: str) -> str:
    return quote(s, safe="-_.~")


def canonical_query(raw_query: str, drop: str | None = None) -> str:
    """Each pair decoded and re-encoded the SigV4 way, sorted by key then value (``drop``:
    the presigned URL's own ``X-Amz-Signature``)."""
    pairs = []
    for part in raw_query.split("&") if raw_query else []:
        if not part:
            continue
        k, _, v = part.partition("=")
        k, v = unquote(k.replace("+", "%20")), unquote(v.replace("+", "%20"))
        if k == drop:
            continue
        pairs.append((_enc(k), _enc(v)))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def _query_params(raw_query: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in raw_query.split("&") if raw_query else []:
        k, _, v = part.partition("=")
        out[unquote(k)] = unquote(v)
    return out


def _parse_amz_date(s: str) -> dt.datetime:
    try:
        return dt.datetime.strptime(s, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        raise S3AuthError("AccessDenied", f"malformed X-Amz-Date {s!r}") from None


class SigV4Verifier:
    """Checks one request against one access key / secret (the stack's own)."""

    def __init__(self, access_key: str, secret_key: str, max_skew_s: float = MAX_SKEW_S) -> None:
        if not access_key or not secret_key:
            raise ValueError("SigV4Verifier needs an access key and a secret key")
        self.access_key, self.secret_key, self.max_skew_s = access_key, secret_key, max_skew_s

    def verify(self, method: str, target: str, headers: list[tuple[str, str]],
               now: dt.datetime | None = None) -> Verified:
        """``target``: the request line's path and query exactly as received; ``headers``:
        every (name, value) pair as received (repeats kept). Raises :class:`S3AuthError`."""
        now = now or dt.datetime.now(dt.UTC)
        path, _, raw_query = target.partition("?")
        hmap: dict[str, list[str]] = {}
        for name, value in headers:
            hmap.setdefault(name.lower(), []).append(value)
        query = _query_params(raw_query)
        auth = hmap.get("authorization")
        presigned = "X-Amz-Algorithm" in query
        if auth and presigned:
            raise S3AuthError("InvalidArgument", "only one auth mechanism allowed", 400)
        if presigned:
            claim = self._presigned_claim(query, raw_query, now)
        else:
            claim = self._header_claim(auth, hmap, raw_query, now)
        _check_payload_hash(claim.payload_hash)
        day, region, service = self._scope(claim)
        canonical_headers = _canonical_headers(claim.signed, hmap)
        creq = "\n".join([method, path, claim.cquery, canonical_headers, claim.signed.lower(),
                          claim.payload_hash])
        scope = f"{day}/{region}/{service}/aws4_request"
        to_sign = "\n".join([ALGORITHM, claim.amz_date, scope, _sha256(creq.encode())])
        want = hmac.new(signing_key(self.secret_key, day, region, service), to_sign.encode(),
                        hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, claim.signature.lower()):
            raise S3AuthError("SignatureDoesNotMatch", "the request signature we calculated "
                              "does not match the signature you provided")
        return Verified(claim.payload_hash, presigned)

    def _presigned_claim(self, query: dict[str, str], raw_query: str,
                         now: dt.datetime) -> _Claim:
        """What a presigned URL's ``X-Amz-*`` parameters claim, once its validity window is
        checked (a leaked URL must stop working when it expires)."""
        if query["X-Amz-Algorithm"] != ALGORITHM:
            raise S3AuthError("AccessDenied", "only AWS4-HMAC-SHA256 is accepted")
        try:
            credential, signed, signature = (query["X-Amz-Credential"],
                                             query["X-Amz-SignedHeaders"],
                                             query["X-Amz-Signature"])
            amz_date, expires = query["X-Amz-Date"], int(query["X-Amz-Expires"])
        except (KeyError, ValueError):
            raise S3AuthError("AuthorizationQueryParametersError",
                              "incomplete presigned URL", 400) from None
        when = _parse_amz_date(amz_date)
        if not 0 < expires <= MAX_PRESIGN_EXPIRES_S:
            raise S3AuthError("AuthorizationQueryParametersError",
                              "X-Amz-Expires out of range", 400)
        if now > when + dt.timedelta(seconds=expires):
            raise S3AuthError("AccessDenied", "Request has expired")
        if when - now > dt.timedelta(seconds=self.max_skew_s):
            raise S3AuthError("RequestTimeTooSkewed", "request date is in the future")
        return _Claim(credential, signed, signature, amz_date,
                      query.get("X-Amz-Content-Sha256", UNSIGNED),
                      canonical_query(raw_query, drop="X-Amz-Signature"))

    def _header_claim(self, auth: list[str] | None, hmap: dict[str, list[str]],
                      raw_query: str, now: dt.datetime) -> _Claim:
        """What an ``Authorization`` header claims, once its date is within the skew (a
        replayed request must stop working)."""
        if not auth:
            raise S3AuthError("AccessDenied", "anonymous access is not allowed: sign the "
                              "request (AWS SigV4) with the stack's keys")
        m = _AUTH_RE.match(auth[0].strip())
        if len(auth) != 1 or not m:
            raise S3AuthError("AccessDenied", "malformed or unsupported Authorization "
                              "header (AWS4-HMAC-SHA256 only)")
        dates = hmap.get("x-amz-date")
        if not dates:
            raise S3AuthError("AccessDenied", "X-Amz-Date header missing")
        amz_date = dates[0].strip()
        when = _parse_amz_date(amz_date)
        if abs((now - when).total_seconds()) > self.max_skew_s:
            raise S3AuthError("RequestTimeTooSkewed", "the difference between the request "
                              "time and the server's time is too large")
        ph = hmap.get("x-amz-content-sha256")
        if not ph:
            raise S3AuthError("InvalidRequest", "x-amz-content-sha256 header missing", 400)
        return _Claim(m.group(1), m.group(2), m.group(3).lower(), amz_date, ph[0].strip(),
                      canonical_query(raw_query))

    def _scope(self, claim: _Claim) -> tuple[str, str, str]:
        """(day, region, service) of the credential scope, which must name this stack's key
        and the request's own day."""
        parts = claim.credential.split("/")
        if len(parts) != 5 or parts[4] != "aws4_request" or parts[3] != "s3":
            raise S3AuthError("AuthorizationHeaderMalformed", "bad credential scope", 400)
        key_id, day, region, service, _ = parts
        if not hmac.compare_digest(key_id.encode(), self.access_key.encode()):
            raise S3AuthError("InvalidAccessKeyId", "the access key id does not exist")
        if day != claim.amz_date[:8]:
            raise S3AuthError("AuthorizationHeaderMalformed",
                              "credential date does not match X-Amz-Date", 400)
        return day, region, service


@dataclass(frozen=True)
class _Claim:
    """The signature parameters a request carries, wherever it carries them (header auth or
    presigned query): past this point both are checked the same way."""

    credential: str
    signed: str
    signature: str
    amz_date: str
    payload_hash: str
    cquery: str


def _check_payload_hash(payload_hash: str) -> None:
    """Only a whole-body hash or ``UNSIGNED-PAYLOAD`` can be checked before forwarding;
    aws-chunked payloads get their own answer, since a client can switch them off."""
    if payload_hash != UNSIGNED and not _HEX64.match(payload_hash):
        if payload_hash.startswith("STREAMING-"):
            raise S3AuthError("NotImplemented", f"{payload_hash} (aws-chunked) payloads "
                              "are not supported by this store; sign the whole payload", 501)
        raise S3AuthError("InvalidArgument", "bad x-amz-content-sha256", 400)


def _canonical_headers(signed: str, hmap: dict[str, list[str]]) -> str:
    """The canonical headers block of the signed names; refuses a request whose
    ``x-amz-*`` headers are not all signed (an unsigned ``x-amz-copy-source`` could be
    added to a signed request)."""
    names = signed.lower().split(";")
    if names != sorted(names) or "host" not in names:
        raise S3AuthError("AccessDenied", "SignedHeaders must be sorted and include host")
    unsigned_amz = [h for h in hmap if h.startswith("x-amz-") and h not in names]
    if unsigned_amz:
        raise S3AuthError("AccessDenied", f"headers not signed: {', '.join(unsigned_amz)}")
    lines = []
    for n in names:
        if n not in hmap:
            raise S3AuthError("AccessDenied", f"signed header {n} missing")
        lines.append(f"{n}:{','.join(' '.join(v.split()) for v in hmap[n])}\n")
    return "".join(lines)


def sign_headers(method: str, target: str, host: str, payload_hash: str, key: str,
                 secret: str, region: str = "us-east-1",
                 now: dt.datetime | None = None) -> dict[str, str]:
    """Header auth for a forwarded request (signing host, x-amz-content-sha256, x-amz-date):
    how the proxy speaks to the store behind it with the store's own key."""
    now = now or dt.datetime.now(dt.UTC)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    path, _, raw_query = target.partition("?")
    signed = "host;x-amz-content-sha256;x-amz-date"
    creq = "\n".join([method, path, canonical_query(raw_query),
                      f"host:{host}\nx-amz-content-sha256:{payload_hash}\n"
                      f"x-amz-date:{amz_date}\n", signed, payload_hash])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join([ALGORITHM, amz_date, scope, _sha256(creq.encode())])
    sig = hmac.new(signing_key(secret, day, region, "s3"), to_sign.encode(),
                   hashlib.sha256).hexdigest()
    return {"Host": host, "X-Amz-Content-SHA256": payload_hash, "X-Amz-Date": amz_date,
            "Authorization": f"{ALGORITHM} Credential={key}/{scope}, SignedHeaders={signed}, "
                             f"Signature={sig}"}


def error_xml(code: str, message: str) -> bytes:
    esc = message.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{esc}</Message></Error>").encode()


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self._path)
        self.sock = s


def upstream_factory(upstream: str, timeout: float = 300.0):  # type: ignore[no-untyped-def]
    """``unix:/path/to.sock`` or ``http://host:port``: a function making a fresh connection."""
    if upstream.startswith("unix:"):
        path = upstream[5:]
        return lambda: _UnixConnection(path, timeout)
    hostport = upstream.removeprefix("http://").rstrip("/")
    return lambda: http.client.HTTPConnection(hostport, timeout=timeout)


class ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "scarcelab-s3-proxy"
    verifier: SigV4Verifier
    connect_upstream = None  # set by make_server
    upstream_key: tuple[str, str] = ("S3RVER", "S3RVER")

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib name
        # the request line only: no header (an Authorization header) is ever logged
        sys.stderr.write(f"{self.log_date_time_string()} {format % args}\n")

    def _error(self, e: S3AuthError) -> None:
        body = error_xml(e.code, str(e))
        self.send_response(e.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        # the request body may be unread: do not try to reuse the connection
        self.send_header("Connection", "close")
        self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def handle_expect_100(self) -> bool:
        # Answer 100 Continue only to a request that will be accepted, so an unsigned upload
        # is refused before its body is sent.
        try:
            self._verified = self.verifier.verify(self.command, self.path,
                                                  list(self.headers.items()))
        except S3AuthError as e:  # parse_request then stops: no do_* call follows
            self._verified = None
            self._error(e)
            return False
        return super().handle_expect_100()

    def _read_body(self, payload_hash: str) -> tuple[IO[bytes] | None, int]:
        """The request body spooled (decoded if chunked) and, for a signed payload, checked."""
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        length = self.headers.get("Content-Length")
        if "chunked" not in te and length is None:
            return None, 0
        spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)  # noqa: SIM115
        h = hashlib.sha256()
        n = 0

        def take(b: bytes) -> None:
            nonlocal n
            h.update(b)
            spool.write(b)
            n += len(b)

        if "chunked" in te:
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                left = size
                while left:
                    b = self.rfile.read(min(CHUNK, left))
                    if not b:
                        raise S3AuthError("IncompleteBody", "body ended early", 400)
                    take(b)
                    left -= len(b)
                self.rfile.readline()
        else:
            left = int(length or 0)
            while left:
                b = self.rfile.read(min(CHUNK, left))
                if not b:
                    raise S3AuthError("IncompleteBody", "body ended early", 400)
                take(b)
                left -= len(b)
        if payload_hash != UNSIGNED and not hmac.compare_digest(h.hexdigest(), payload_hash):
            spool.close()
            raise S3AuthError("XAmzContentSHA256Mismatch", "the provided x-amz-content-sha256 "
                              "does not match what was computed", 400)
        spool.seek(0)
        return spool, n

    def _handle(self) -> None:
        try:
            v = getattr(self, "_verified", None) or self.verifier.verify(
                self.command, self.path, list(self.headers.items()))
            self._verified = None
            body, n = self._read_body(v.payload_hash)
        except S3AuthError as e:
            self._error(e)
            return
        path, _, q = self.path.partition("?")
        if v.presigned:  # the request is re-signed below, in headers
            q = "&".join(p for p in q.split("&") if p and not p.startswith("X-Amz-"))
        target = path + (f"?{q}" if q else "")
        auth = sign_headers(self.command, target, self.headers.get("Host", "localhost"),
                            v.payload_hash, *self.upstream_key)
        replaced = {k.lower() for k in auth}
        conn = self.connect_upstream()  # type: ignore[misc]
        try:
            conn.putrequest(self.command, target, skip_host=True, skip_accept_encoding=True)
            for k, val in self.headers.items():
                if k.lower() not in HOP_BY_HOP | replaced and k.lower() != "content-length":
                    conn.putheader(k, val)
            for k, val in auth.items():
                conn.putheader(k, val)
            if body is not None:
                conn.putheader("Content-Length", str(n))
            conn.endheaders()
            if body is not None:
                while b := body.read(CHUNK):
                    conn.send(b)
            resp = conn.getresponse()
            self.send_response_only(resp.status, resp.reason)
            self.send_header("Date", self.date_time_string())
            has_len = resp.getheader("Content-Length") is not None
            for k, val in resp.getheaders():
                if k.lower() not in HOP_BY_HOP and k.lower() != "date":
                    self.send_header(k, val)
            no_body = self.command == "HEAD" or resp.status in (204, 304) or \
                100 <= resp.status < 200
            chunked = not has_len and not no_body
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if not no_body:
                while True:
                    b = resp.read(CHUNK)
                    if not b:
                        break
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b) if chunked else b)
                if chunked:
                    self.wfile.write(b"0\r\n\r\n")
        except OSError as e:
            self.log_message("upstream error: %s", type(e).__name__)
            self.close_connection = True
            try:
                self._error(S3AuthError("ServiceUnavailable", "the store did not answer", 503))
            except OSError:
                pass
        finally:
            conn.close()
            if body is not None:
                body.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_OPTIONS = _handle  # noqa: N815


def make_server(host: str, port: int, upstream: str, access_key: str, secret_key: str,
                upstream_key: tuple[str, str] = ("S3RVER", "S3RVER")) -> ThreadingHTTPServer:
    """``upstream_key``: the store's own (access key, secret), used to re-sign."""
    handler = type("Handler", (ProxyHandler,), {
        "verifier": SigV4Verifier(access_key, secret_key), "upstream_key": upstream_key,
        "connect_upstream": staticmethod(upstream_factory(upstream))})
    srv = ThreadingHTTPServer((host, port), handler)
    srv.daemon_threads = True
    return srv


def serve_in_thread(srv: ThreadingHTTPServer) -> threading.Thread:
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="unix:/path/to.sock or http://host:port")
    a = p.parse_args(argv)
    key, secret = (os.environ.get("SCARCELAB_S3_ACCESS_KEY"),
                   os.environ.get("SCARCELAB_S3_SECRET_KEY"))
    if not key or not secret:
        print("s3_proxy: SCARCELAB_S3_ACCESS_KEY and SCARCELAB_S3_SECRET_KEY must be set",
              file=sys.stderr)
        return 2
    srv = make_server(a.host, a.port, a.upstream, key, secret)
    print(f"s3 proxy on {a.host}:{a.port} -> {a.upstream}", file=sys.stderr, flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
