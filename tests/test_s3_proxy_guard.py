"""Behaviour guard for ``SigV4Verifier.verify``: the outcome (what was verified, or the
S3 error code, HTTP status and message) of every refusal branch, of requests with several
faults at once (which check answers first is behaviour too) and of the edges of the clock
rules, recorded on the code before it was restructured. botocore signs, at a fixed time."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import botocore.auth
import pytest
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

from scarcelab.tracking.s3_proxy import S3AuthError, SigV4Verifier

KEY, SECRET = "SLTESTKEY0001", "s3cr3t/with+chars=="
HOST = "127.0.0.1:14999"
NOW = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.UTC)
STAMP = "20260304T050607Z"
SCOPE = "20260304/us-east-1/s3/aws4_request"
Request = tuple[str, str, list[tuple[str, str]]]


@pytest.fixture(autouse=True)
def _fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(botocore.auth, "get_current_datetime",
                        lambda remove_tzinfo=True: NOW.replace(tzinfo=None))


def _header(method="PUT", path="/bucket/dir/a%20b.txt", query="", body=b"hello",
            headers=None, key=KEY, secret=SECRET, region="us-east-1",
            sign_payload=True) -> Request:
    url = f"http://{HOST}{path}" + (f"?{query}" if query else "")
    req = AWSRequest(method=method, url=url, data=body, headers=dict(headers or {}))
    req.context["client_config"] = Config(s3={"payload_signing_enabled": sign_payload})
    S3SigV4Auth(Credentials(key, secret), "s3", region).add_auth(req)
    p = req.prepare()
    return method, p.url.split(HOST, 1)[1], [("Host", HOST), *p.headers.items()]


def _presigned(path="/bucket/k.txt", expires=60) -> Request:
    req = AWSRequest(method="GET", url=f"http://{HOST}{path}")
    S3SigV4QueryAuth(Credentials(KEY, SECRET), "s3", "us-east-1", expires=expires).add_auth(req)
    return "GET", req.prepare().url.split(HOST, 1)[1], [("Host", HOST)]


def _set_header(req: Request, name: str, value: str | None) -> Request:
    """Replace (or, with None, drop) every header called ``name`` (any case)."""
    m, t, h = req
    out = [(k, v) for k, v in h if k.lower() != name.lower()]
    return m, t, out + ([(name, value)] if value is not None else [])


def _auth(credential=f"{KEY}/{SCOPE}", signed="host;x-amz-content-sha256;x-amz-date",
          signature="0" * 64) -> str:
    return f"AWS4-HMAC-SHA256 Credential={credential}, SignedHeaders={signed}, " \
           f"Signature={signature}"


def _crafted(auth: str | None = None, **headers: str) -> Request:
    """A header-auth request with a made-up signature, for the checks that come before it."""
    h = {"Host": HOST, "x-amz-date": STAMP, "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
         **{k.replace("_", "-"): v for k, v in headers.items()}}
    if auth is not None:
        h["Authorization"] = auth
    return "GET", "/bucket/k", [(k, v) for k, v in h.items() if v != "<drop>"]


def _set_param(req: Request, name: str, value: str | None) -> Request:
    m, t, h = req
    path, _, q = t.partition("?")
    parts = [p for p in q.split("&") if not p.startswith(name + "=")]
    if value is not None:
        parts.append(f"{name}={value}")
    return m, path + "?" + "&".join(parts), h


def _outcome(req: Request, now: dt.datetime = NOW) -> tuple:
    try:
        v = SigV4Verifier(KEY, SECRET).verify(*req, now=now)
    except S3AuthError as e:
        return ("refused", e.code, e.status, str(e))
    return ("verified", v.payload_hash, v.presigned)


MIN = dt.timedelta(minutes=1)
SEC = dt.timedelta(seconds=1)
CASES: dict[str, Callable[[], tuple]] = {
    # header auth, accepted
    "h_ok": lambda: _outcome(_header()),
    "h_ok_unsigned_payload": lambda: _outcome(_header(sign_payload=False)),
    "h_ok_query_and_amz_headers": lambda: _outcome(_header(
        method="GET", path="/bucket", body=b"",
        query="prefix=a%2Fb%20c&list-type=2&delimiter=%2F&uploads",
        headers={"x-amz-meta-note": "  a   b ", "Content-Type": "text/plain"})),
    "h_ok_region": lambda: _outcome(_header(region="eu-west-1")),
    "h_ok_skew_edge_ahead": lambda: _outcome(_header(), NOW + 15 * MIN),
    "h_ok_skew_edge_behind": lambda: _outcome(_header(), NOW - 15 * MIN),
    "h_ok_uppercase_signature": lambda: _outcome(_set_header(
        _header(), "Authorization",
        dict(_header()[2])["Authorization"][:-64] + dict(_header()[2])["Authorization"][-64:]
        .upper())),
    # header auth, refused
    "h_skew_ahead": lambda: _outcome(_header(), NOW + 15 * MIN + SEC),
    "h_skew_behind": lambda: _outcome(_header(), NOW - 15 * MIN - SEC),
    "h_anonymous": lambda: _outcome(_set_header(_header(), "Authorization", None)),
    "h_two_authorization": lambda: _outcome(
        ("PUT", _header()[1], [*_header()[2], ("authorization", dict(_header()[2])[
            "Authorization"])])),
    "h_malformed_authorization": lambda: _outcome(_crafted("AWS4-HMAC-SHA256 garbage")),
    "h_sigv2": lambda: _outcome(_crafted("AWS SLTESTKEY0001:abc=")),
    "h_no_date": lambda: _outcome(_crafted(_auth(), x_amz_date="<drop>")),
    "h_bad_date": lambda: _outcome(_crafted(_auth(), x_amz_date="2026-03-04")),
    "h_two_dates": lambda: _outcome(("PUT", _header()[1],
                                     [*_header()[2], ("X-Amz-Date", "20260304T050608Z")])),
    "h_no_payload_hash": lambda: _outcome(_crafted(_auth(), x_amz_content_sha256="<drop>")),
    "h_bad_payload_hash": lambda: _outcome(_crafted(_auth(), x_amz_content_sha256="xyz")),
    "h_upper_payload_hash": lambda: _outcome(_crafted(_auth(), x_amz_content_sha256="A" * 64)),
    "h_streaming": lambda: _outcome(_crafted(
        _auth(), x_amz_content_sha256="STREAMING-AWS4-HMAC-SHA256-PAYLOAD")),
    "h_scope_four_parts": lambda: _outcome(_crafted(_auth(f"{KEY}/20260304/us-east-1/s3"))),
    "h_scope_service": lambda: _outcome(_crafted(_auth(f"{KEY}/20260304/us-east-1/ec2/"
                                                       "aws4_request"))),
    "h_scope_terminator": lambda: _outcome(_crafted(_auth(f"{KEY}/20260304/us-east-1/s3/"
                                                          "aws4_other"))),
    "h_wrong_key": lambda: _outcome(_crafted(_auth(f"S3RVER/{SCOPE}"))),
    "h_day_mismatch": lambda: _outcome(_crafted(_auth(f"{KEY}/20260305/us-east-1/s3/"
                                                      "aws4_request"))),
    "h_unsorted_signed": lambda: _outcome(_crafted(_auth(
        signed="x-amz-date;host;x-amz-content-sha256"))),
    "h_no_host_signed": lambda: _outcome(_crafted(_auth(signed="x-amz-content-sha256;"
                                                        "x-amz-date"))),
    "h_uppercase_signed_names": lambda: _outcome(_crafted(_auth(
        signed="HOST;X-AMZ-CONTENT-SHA256;X-AMZ-DATE"))),
    "h_unsigned_amz": lambda: _outcome(_crafted(_auth(), x_amz_meta_a="1", x_amz_acl="p")),
    "h_signed_header_missing": lambda: _outcome(_crafted(_auth(
        signed="content-type;host;x-amz-content-sha256;x-amz-date"))),
    "h_signature_mismatch": lambda: _outcome(_crafted(_auth())),
    "h_wrong_secret": lambda: _outcome(_header(secret="nope")),
    "h_tampered_path": lambda: _outcome(("PUT", "/bucket/dir/a%20c.txt", _header()[2])),
    # header auth, several faults: the first check to fail answers
    "hx_anonymous_and_bad_date": lambda: _outcome(_crafted(None, x_amz_date="bad")),
    "hx_bad_date_and_no_hash": lambda: _outcome(_crafted(_auth(), x_amz_date="bad",
                                                         x_amz_content_sha256="<drop>")),
    "hx_skew_and_no_hash": lambda: _outcome(_crafted(_auth(), x_amz_content_sha256="<drop>"),
                                            NOW + 20 * MIN),
    "hx_bad_hash_and_scope": lambda: _outcome(_crafted(_auth("x/y"),
                                                       x_amz_content_sha256="xyz")),
    "hx_scope_and_key": lambda: _outcome(_crafted(_auth("S3RVER/20260304/us-east-1/ec2/"
                                                        "aws4_request"))),
    "hx_key_and_day": lambda: _outcome(_crafted(_auth("S3RVER/20260305/us-east-1/s3/"
                                                      "aws4_request"))),
    "hx_day_and_unsorted": lambda: _outcome(_crafted(_auth(
        f"{KEY}/20260305/us-east-1/s3/aws4_request", signed="x-amz-date;host"))),
    "hx_unsorted_and_unsigned": lambda: _outcome(_crafted(_auth(signed="x-amz-date;host"),
                                                          x_amz_meta_a="1")),
    "hx_unsigned_and_missing": lambda: _outcome(_crafted(_auth(
        signed="content-type;host;x-amz-date"), x_amz_meta_a="1")),
    # presigned URLs
    "p_ok": lambda: _outcome(_presigned()),
    "p_ok_expiry_edge": lambda: _outcome(_presigned(expires=60), NOW + 60 * SEC),
    "p_ok_future_edge": lambda: _outcome(_presigned(), NOW - 15 * MIN),
    "p_added_payload_param": lambda: _outcome(_set_param(
        _presigned(), "X-Amz-Content-Sha256", "UNSIGNED-PAYLOAD")),
    "p_expired": lambda: _outcome(_presigned(expires=60), NOW + 61 * SEC),
    "p_future": lambda: _outcome(_presigned(), NOW - 15 * MIN - SEC),
    "p_and_header_auth": lambda: _outcome(_set_header(_presigned(), "Authorization",
                                                      _auth())),
    "p_bad_algorithm": lambda: _outcome(_set_param(_presigned(), "X-Amz-Algorithm",
                                                   "AWS4-HMAC-SHA1")),
    "p_no_credential": lambda: _outcome(_set_param(_presigned(), "X-Amz-Credential", None)),
    "p_no_signature": lambda: _outcome(_set_param(_presigned(), "X-Amz-Signature", None)),
    "p_expires_not_int": lambda: _outcome(_set_param(_presigned(), "X-Amz-Expires", "1.5")),
    "p_bad_date": lambda: _outcome(_set_param(_presigned(), "X-Amz-Date", "yesterday")),
    "p_expires_zero": lambda: _outcome(_set_param(_presigned(), "X-Amz-Expires", "0")),
    "p_expires_too_long": lambda: _outcome(_set_param(_presigned(), "X-Amz-Expires",
                                                      "604801")),
    "p_streaming_param": lambda: _outcome(_set_param(
        _presigned(), "X-Amz-Content-Sha256", "STREAMING-UNSIGNED-PAYLOAD-TRAILER")),
    "p_bad_payload_param": lambda: _outcome(_set_param(_presigned(), "X-Amz-Content-Sha256",
                                                       "nothex")),
    "p_tampered_path": lambda: _outcome(("GET", _presigned()[1].replace("k.txt", "o.txt"),
                                         [("Host", HOST)])),
    "p_unsigned_amz_header": lambda: _outcome(_set_header(_presigned(), "x-amz-acl", "p")),
    "px_bad_algorithm_and_missing": lambda: _outcome(_set_param(_set_param(
        _presigned(), "X-Amz-Algorithm", "x"), "X-Amz-Date", None)),
    "px_bad_date_and_expires": lambda: _outcome(_set_param(_set_param(
        _presigned(), "X-Amz-Date", "bad"), "X-Amz-Expires", "0")),
    "px_expires_range_and_expired": lambda: _outcome(_set_param(
        _presigned(), "X-Amz-Expires", "0"), NOW + 100 * MIN),
}

# recorded on the code before verify was split into helpers
EXPECTED: dict[str, tuple] = {
    'h_anonymous': (
        'refused',
        'AccessDenied',
        403,
        "anonymous access is not allowed: sign the request (AWS SigV4) with the stack's keys",
    ),
    'h_bad_date': ('refused', 'AccessDenied', 403, "malformed X-Amz-Date '2026-03-04'"),
    'h_bad_payload_hash': ('refused', 'InvalidArgument', 400, 'bad x-amz-content-sha256'),
    'h_day_mismatch': (
        'refused',
        'AuthorizationHeaderMalformed',
        400,
        'credential date does not match X-Amz-Date',
    ),
    'h_malformed_authorization': (
        'refused',
        'AccessDenied',
        403,
        'malformed or unsupported Authorization header (AWS4-HMAC-SHA256 only)',
    ),
    'h_no_date': ('refused', 'AccessDenied', 403, 'X-Amz-Date header missing'),
    'h_no_host_signed': (
        'refused',
        'AccessDenied',
        403,
        'SignedHeaders must be sorted and include host',
    ),
    'h_no_payload_hash': ('refused', 'InvalidRequest', 400, 'x-amz-content-sha256 header missing'),
    'h_ok': ('verified', '2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824', False),
    'h_ok_query_and_amz_headers': (
        'verified',
        'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
        False,
    ),
    'h_ok_region': (
        'verified',
        '2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824',
        False,
    ),
    'h_ok_skew_edge_ahead': (
        'verified',
        '2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824',
        False,
    ),
    'h_ok_skew_edge_behind': (
        'verified',
        '2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824',
        False,
    ),
    'h_ok_unsigned_payload': ('verified', 'UNSIGNED-PAYLOAD', False),
    'h_ok_uppercase_signature': (
        'verified',
        '2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824',
        False,
    ),
    'h_scope_four_parts': ('refused', 'AuthorizationHeaderMalformed', 400, 'bad credential scope'),
    'h_scope_service': ('refused', 'AuthorizationHeaderMalformed', 400, 'bad credential scope'),
    'h_scope_terminator': ('refused', 'AuthorizationHeaderMalformed', 400, 'bad credential scope'),
    'h_signature_mismatch': (
        'refused',
        'SignatureDoesNotMatch',
        403,
        'the request signature we calculated does not match the signature you provided',
    ),
    'h_signed_header_missing': (
        'refused',
        'AccessDenied',
        403,
        'signed header content-type missing',
    ),
    'h_sigv2': (
        'refused',
        'AccessDenied',
        403,
        'malformed or unsupported Authorization header (AWS4-HMAC-SHA256 only)',
    ),
    'h_skew_ahead': (
        'refused',
        'RequestTimeTooSkewed',
        403,
        "the difference between the request time and the server's time is too large",
    ),
    'h_skew_behind': (
        'refused',
        'RequestTimeTooSkewed',
        403,
        "the difference between the request time and the server's time is too large",
    ),
    'h_streaming': (
        'refused',
        'NotImplemented',
        501,
        ('STREAMING-AWS4-HMAC-SHA256-PAYLOAD (aws-chunked) payloads are not supported by this '
         'store; sign the whole payload'),
    ),
    'h_tampered_path': (
        'refused',
        'SignatureDoesNotMatch',
        403,
        'the request signature we calculated does not match the signature you provided',
    ),
    'h_two_authorization': (
        'refused',
        'AccessDenied',
        403,
        'malformed or unsupported Authorization header (AWS4-HMAC-SHA256 only)',
    ),
    'h_two_dates': (
        'refused',
        'SignatureDoesNotMatch',
        403,
        'the request signature we calculated does not match the signature you provided',
    ),
    'h_unsigned_amz': (
        'refused',
        'AccessDenied',
        403,
        'headers not signed: x-amz-meta-a, x-amz-acl',
    ),
    'h_unsorted_signed': (
        'refused',
        'AccessDenied',
        403,
        'SignedHeaders must be sorted and include host',
    ),
    'h_upper_payload_hash': ('refused', 'InvalidArgument', 400, 'bad x-amz-content-sha256'),
    'h_uppercase_signed_names': (
        'refused',
        'SignatureDoesNotMatch',
        403,
        'the request signature we calculated does not match the signature you provided',
    ),
    'h_wrong_key': ('refused', 'InvalidAccessKeyId', 403, 'the access key id does not exist'),
    'h_wrong_secret': (
        'refused',
        'SignatureDoesNotMatch',
        403,
        'the request signature we calculated does not match the signature you provided',
    ),
    'hx_anonymous_and_bad_date': (
        'refused',
        'AccessDenied',
        403,
        "anonymous access is not allowed: sign the request (AWS SigV4) with the stack's keys",
    ),
    'hx_bad_date_and_no_hash': ('refused', 'AccessDenied', 403, "malformed X-Amz-Date 'bad'"),
    'hx_bad_hash_and_scope': ('refused', 'InvalidArgument', 400, 'bad x-amz-content-sha256'),
    'hx_day_and_unsorted': (
        'refused',
        'AuthorizationHeaderMalformed',
        400,
        'credential date does not match X-Amz-Date',
    ),
    'hx_key_and_day': ('refused', 'InvalidAccessKeyId', 403, 'the access key id does not exist'),
    'hx_scope_and_key': ('refused', 'AuthorizationHeaderMalformed', 400, 'bad credential scope'),
    'hx_skew_and_no_hash': (
        'refused',
        'RequestTimeTooSkewed',
        403,
        "the difference between the request time and the server's time is too large",
    ),
    'hx_unsigned_and_missing': (
        'refused',
        'AccessDenied',
        403,
        'headers not signed: x-amz-content-sha256, x-amz-meta-a',
    ),
    'hx_unsorted_and_unsigned': (
        'refused',
        'AccessDenied',
        403,
        'SignedHeaders must be sorted and include host',
    ),
    'p_added_payload_param': (
        'refused',
        'SignatureDoesNotMatch',
        403,
        'the request signature we calculated does not match the signature you provided',
    ),
    'p_and_header_auth': ('refused', 'InvalidArgument', 400, 'only one auth mechanism allowed'),
    'p_bad_algorithm': ('refused', 'AccessDenied', 403, 'only AWS4-HMAC-SHA256 is accepted'),
    'p_bad_date': ('refused', 'AccessDenied', 403, "malformed X-Amz-Date 'yesterday'"),
    'p_bad_payload_param': ('refused', 'InvalidArgument', 400, 'bad x-amz-content-sha256'),
    'p_expired': ('refused', 'AccessDenied', 403, 'Request has expired'),
    'p_expires_not_int': (
        'refused',
        'AuthorizationQueryParametersError',
        400,
        'incomplete presigned URL',
    ),
    'p_expires_too_long': (
        'refused',
        'AuthorizationQueryParametersError',
        400,
        'X-Amz-Expires out of range',
    ),
    'p_expires_zero': (
        'refused',
        'AuthorizationQueryParametersError',
        400,
        'X-Amz-Expires out of range',
    ),
    'p_future': ('refused', 'RequestTimeTooSkewed', 403, 'request date is in the future'),
    'p_no_credential': (
        'refused',
        'AuthorizationQueryParametersError',
        400,
        'incomplete presigned URL',
    ),
    'p_no_signature': (
        'refused',
        'AuthorizationQueryParametersError',
        400,
        'incomplete presigned URL',
    ),
    'p_ok': ('verified', 'UNSIGNED-PAYLOAD', True),
    'p_ok_expiry_edge': ('verified', 'UNSIGNED-PAYLOAD', True),
    'p_ok_future_edge': ('verified', 'UNSIGNED-PAYLOAD', True),
    'p_streaming_param': (
        'refused',
        'NotImplemented',
        501,
        ('STREAMING-UNSIGNED-PAYLOAD-TRAILER (aws-chunked) payloads are not supported by this '
         'store; sign the whole payload'),
    ),
    'p_tampered_path': (
        'refused',
        'SignatureDoesNotMatch',
        403,
        'the request signature we calculated does not match the signature you provided',
    ),
    'p_unsigned_amz_header': ('refused', 'AccessDenied', 403, 'headers not signed: x-amz-acl'),
    'px_bad_algorithm_and_missing': (
        'refused',
        'AccessDenied',
        403,
        'only AWS4-HMAC-SHA256 is accepted',
    ),
    'px_bad_date_and_expires': ('refused', 'AccessDenied', 403, "malformed X-Amz-Date 'bad'"),
    'px_expires_range_and_expired': (
        'refused',
        'AuthorizationQueryParametersError',
        400,
        'X-Amz-Expires out of range',
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_verify_outcome_is_unchanged(name: str) -> None:
    assert CASES[name]() == EXPECTED[name]
