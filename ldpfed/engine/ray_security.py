"""Ray's security settings for a Ray that ldpfed starts: a private cluster token, token authentication on without
Ray's warning, and no metrics exporter listening on every interface.

Ray (2.5x+) generates `~/.ray/auth_token` itself (`ray get-auth-token --generate`, or a new local `ray.init()`)
with the process umask, i.e. usually mode 0644: readable by every local user, who could then drive the cluster.
`ensure_private_token` creates the token file with mode 0600 before Ray would, and narrows an existing one of
ours to 0600. When RAY_AUTH_MODE is unset, a new local Ray turns token auth on by itself and prints a warning that
suggests turning it off; `enable_token_auth` sets the mode explicitly (after making sure a private token exists),
so the warning does not appear. An explicit RAY_AUTH_MODE=disabled is respected.

Where the token lives (Ray's own lookup order): RAY_AUTH_TOKEN (the token itself, no file), else the file
RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token.

Metrics: each node's metrics exporter (Prometheus HTTP, no token) binds to all interfaces unless the node's IP is
literally 127.0.0.1, which `ray start`/`ray.init` replace by the machine's outward address; Ray has no option to
bind it to loopback otherwise, so `disable_metrics_export` turns it off (ldpfed does not use Ray's metrics).
"""
from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

AUTH_MODE = "RAY_AUTH_MODE"
METRICS = "RAY_enable_metrics_collection"


def token_path(environ=None) -> Path | None:
    """The token file Ray reads, or None when the token is given in RAY_AUTH_TOKEN."""
    environ = os.environ if environ is None else environ
    if environ.get("RAY_AUTH_TOKEN"):
        return None
    return Path(environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token").expanduser()


def ensure_private_token(environ=None) -> Path | None:
    """A non-empty token file readable by its owner only (mode 0600); created with a fresh 256-bit token if
    missing or empty. Returns its path (None when RAY_AUTH_TOKEN holds the token). Refuses (PermissionError) a
    token file that is not a regular file owned by this user: someone else's token is not ours to use or widen."""
    path = token_path(environ)
    if path is None:
        return None
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        # O_EXCL: never through a file (or symlink) someone put there; 0600 from the first byte
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise PermissionError(f"the Ray token file {path} is not a regular file owned by uid {os.getuid()}: "
                                  "refusing to use it; remove it or set RAY_AUTH_TOKEN_PATH") from None
        if info.st_mode & 0o077:
            os.chmod(path, 0o600)       # Ray's own generation leaves it 0644
        if path.read_text().strip():
            return path
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))  # what Ray's generator writes: 256 bits, hex, no newline
    return path


def enable_token_auth() -> bool:
    """For a new local Ray started by this process: token auth on (RAY_AUTH_MODE=token, inherited by the nodes
    and workers), with a private token. Returns False, changing nothing, if RAY_AUTH_MODE says otherwise."""
    mode = os.environ.get(AUTH_MODE)
    if mode is not None and mode.lower() != "token":
        return False
    ensure_private_token()
    if mode is None:
        os.environ[AUTH_MODE] = "token"
        # Ray caches its config (auth mode included) at import; re-read it, as Ray's own token setup does
        from ray._raylet import Config

        Config.initialize("")
    return True


def disable_metrics_export(environ=None) -> None:
    """No per-node metrics exporter (it would listen on all interfaces without the token), unless the caller set
    RAY_enable_metrics_collection explicitly. Must be in the environment before the nodes start."""
    environ = os.environ if environ is None else environ
    environ.setdefault(METRICS, "0")
