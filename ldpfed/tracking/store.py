"""Where runs are tracked: resolving the tracking URI and checking, quickly, that it can be reached.

The embedded default is MLflow 3's own: a SQLite file `mlflow.db` in the working directory, artifacts in
`./mlruns` beside it, no server. An `http(s)://` URI (argument or MLFLOW_TRACKING_URI) points at an MLflow
server; it is probed with one short request without retries before any simulation starts, because MLflow's own
client retries with exponential backoff for minutes before it gives up.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
import re
from urllib.parse import parse_qsl, unquote, urlencode, urlparse, urlunparse

DEFAULT_EMBEDDED_URI = "sqlite:///mlflow.db"


# Query parameters of a URI whose values are secrets (e.g. postgresql://host/db?password=...).
_SECRET_QUERY = re.compile(r"pass|pwd|secret|token|key|auth|credential|signature|sig$", re.IGNORECASE)


def redact(uri) -> str:
    """`uri` with its credentials replaced by `***`, for anything written or shown (files, logs, errors, the UI
    link): the password of `scheme://user:password@host` (the user name too, when it is a token alone) and the
    values of query parameters such as `?token=` or `?password=`. Plain paths come back unchanged."""
    text = str(uri)
    try:
        parts = urlparse(text)
    except ValueError:
        return re.sub(r"//[^/@]*@", "//***@", text)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0] if ":" in userinfo else "***"
        netloc = f"{user}:***@{host}" if ":" in userinfo else f"***@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, "***" if _SECRET_QUERY.search(k) else v) for k, v in pairs], safe="*/:")
    if netloc == parts.netloc and query == parts.query:
        return text
    return urlunparse(parts._replace(netloc=netloc, query=query))


_USERINFO = re.compile(r"(\w[\w+.-]*://)([^/\s@:'\"]*)(:[^/\s@'\"]*)?@")
_QUERY_SECRET = re.compile(r"([?&][^=&\s'\"]*(?:pass|pwd|secret|token|key|auth|credential|sig)[^=&\s'\"]*=)[^&\s'\"]*",
                           re.IGNORECASE)


def scrub(text) -> str:
    """Any URI inside free text (an error message, a log line) with its credentials redacted as by `redact`."""
    text = _USERINFO.sub(lambda m: f"{m.group(1)}{m.group(2)}:***@" if m.group(3) else f"{m.group(1)}***@",
                         str(text))
    return _QUERY_SECRET.sub(lambda m: m.group(1) + "***", text)


class TrackingUnavailable(RuntimeError):
    """The tracking store cannot be used: unreachable server, refused credentials, unwritable database.

    `uri` names the store (credentials redacted); the message says what failed and how to proceed (local results
    only, or another URI).
    """

    def __init__(self, uri: str, reason: str):
        self.uri, self.reason = redact(uri), scrub(reason)
        super().__init__(f"MLflow tracking at {self.uri!r} is unavailable: {self.reason}")


def resolve_tracking_uri(tracking_uri: str | None = None) -> str:
    """The URI to use: the argument, else MLFLOW_TRACKING_URI, else the embedded SQLite store in the cwd.

    A relative SQLite path is made absolute now, so a later change of directory does not move the store.
    """
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_EMBEDDED_URI
    if not isinstance(uri, str) or not uri.strip():
        raise TrackingUnavailable(repr(uri), "the tracking URI must be a non-empty string")
    uri = uri.strip()
    if uri.startswith("sqlite:///"):
        path = unquote(uri[len("sqlite:///"):])
        if path and path != ":memory:":
            return "sqlite:///" + str(Path(path).expanduser().resolve())
    return uri


def sqlite_path(uri: str) -> Path | None:
    if uri.startswith("sqlite:///"):
        path = unquote(uri[len("sqlite:///"):])
        return Path(path) if path and path != ":memory:" else None
    return None


# The embedded stores whose connections write through SQLite's write-ahead log (see `write_ahead_log`)
_WAL_FILES: set[str] = set()


def write_ahead_log(path: Path) -> None:
    """Make MLflow's connections to the SQLite file `path` use the write-ahead log with synchronous=NORMAL, not
    SQLite's default rollback journal with a sync at every commit: a sweep logs a run in a few transactions, whose
    syncs cost ~8% of each run's logging time on an idle machine and about half on a busy one
    (jobs/bench_tracking.py, docs/scaling.md). A crash of the process loses nothing
    committed and cannot corrupt the file; a power cut may lose the last commits. The UI's server may read while
    a sweep writes. Applied as connections open (a SQLAlchemy listener: MLflow makes the engine)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    if not _WAL_FILES:
        event.listen(Engine, "connect", _pragmas)
    _WAL_FILES.add(str(path.resolve()))


def _pragmas(connection, _record) -> None:
    import sqlite3

    if not isinstance(connection, sqlite3.Connection):
        return
    cursor = connection.cursor()
    try:
        files = {row[2] for row in cursor.execute("PRAGMA database_list") if row[1] == "main"}
        if files & _WAL_FILES:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def is_http(uri: str) -> bool:
    return urlparse(uri).scheme in ("http", "https")


def probe(uri: str, timeout: float = 5.0) -> None:
    """Raise TrackingUnavailable unless the store at `uri` answers within `timeout` seconds (no retries)."""
    if is_http(uri):
        _probe_http(uri, timeout)
        return
    path = sqlite_path(uri)
    if path is not None:
        folder = path.parent
        if not folder.is_dir():
            raise TrackingUnavailable(uri, f"the folder of the SQLite file does not exist: {folder}")
        if not os.access(folder, os.W_OK):
            raise TrackingUnavailable(uri, f"the folder of the SQLite file is not writable: {folder}")
        write_ahead_log(path)
    # Database and file stores (and any other scheme): one real call, with HTTP retries off in case a plugin
    # store talks HTTP underneath.
    from mlflow import MlflowClient

    with http_policy(retries=0, timeout=timeout):
        try:
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        except Exception as exc:  # noqa: BLE001 - any failure of the store is reported the same way
            raise TrackingUnavailable(uri, f"{type(exc).__name__}: {first_line(exc)}") from exc


def _probe_http(uri: str, timeout: float) -> None:
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    endpoint = "/api/2.0/mlflow/experiments/get-by-name"
    try:
        response = http_request(get_default_host_creds(uri), endpoint, "GET", max_retries=0, backoff_factor=0,
                                backoff_jitter=0, timeout=timeout, raise_on_status=False,
                                params={"experiment_name": "ldpfed-connectivity-probe"})
    except Exception as exc:  # noqa: BLE001 - connection refused, DNS, TLS, timeout
        raise TrackingUnavailable(uri, f"{_connection_problem(exc, timeout)}. Start the server, fix "
                                  "MLFLOW_TRACKING_URI (or --tracking-uri), or run without tracking "
                                  "(local results only)") from exc
    status = response.status_code
    if status in (401, 403):
        raise TrackingUnavailable(uri, f"the server refused the credentials (HTTP {status}); set "
                                  "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN")
    if status == 200 or (status == 404 and "RESOURCE_DOES_NOT_EXIST" in response.text):
        return
    raise TrackingUnavailable(uri, f"the server answered HTTP {status} to {endpoint}, which an MLflow tracking "
                              f"server does not: {response.text[:200]!r}")


# Environment variables read by MLflow at each HTTP request (tracking REST calls and proxied artifact uploads).
_HTTP_ENV = {"retries": "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "timeout": "MLFLOW_HTTP_REQUEST_TIMEOUT",
             "backoff": "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"}


@contextlib.contextmanager
def http_policy(retries: int, timeout: float, backoff: int | None = None, override_user: bool = True):
    """Temporarily bound MLflow's HTTP retries and timeout (driver-only: it sets process environment variables).

    With override_user=False, values the user set in the environment win.
    """
    wanted = {"retries": int(retries), "timeout": max(1, int(round(timeout))),
              "backoff": int(backoff if backoff is not None else (1 if retries else 0))}
    saved = {}
    try:
        for key, value in wanted.items():
            name = _HTTP_ENV[key]
            if not override_user and name in os.environ:
                continue
            saved[name] = os.environ.get(name)
            os.environ[name] = str(value)
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def first_line(exc: BaseException) -> str:
    """The first line of an error (300 chars at most), with any URI's credentials redacted (errors may quote the
    tracking URI); "" for an error without a message."""
    text = str(exc).strip().splitlines()
    return scrub(text[0][:300]) if text else ""


def _connection_problem(exc: BaseException, timeout: float) -> str:
    """A short, plain reason for a failed connection (MLflow's own message nests urllib3's, 500 chars long)."""
    text = str(exc)
    if "Connection refused" in text:
        return "connection refused (nothing listens at that address and port)"
    if "Name or service not known" in text or "nodename nor servname" in text or "getaddrinfo" in text:
        return "the host name does not resolve"
    if "timed out" in text.lower() or "timeout" in text.lower():
        return f"no answer within {timeout:g} s"
    if "SSL" in text or "certificate" in text.lower():
        return f"TLS failed ({first_line(exc)[:200] or type(exc).__name__})"
    return f"cannot connect ({first_line(exc)[:200] or type(exc).__name__})"
