"""Joining or starting the Ray instance a run uses (`ensure_ray`): a new local one on loopback, with token auth."""
from __future__ import annotations

import os
import signal
import threading

import ray

from ldpfed.engine.ray_options import ray_address
from ldpfed.engine.ray_security import disable_metrics_export, enable_token_auth

LOOPBACK_NODE_IP = "127.0.0.2"
NICENESS = "RAY_worker_niceness"     # read by a local Ray's raylet when it starts: an increment over its own


def ensure_ray(address=None, **init_kwargs) -> bool:
    """Connect to `address` (or RAY_ADDRESS), or start a local Ray; True if this call started it."""
    if ray.is_initialized():
        return False
    address = ray_address(address)      # and RAY_ADDRESS, which ray.init reads for None or "auto"
    kwargs = {"include_dashboard": False, "logging_level": "WARNING", "log_to_driver": True, **init_kwargs}
    starts_one = address is None and not os.environ.get("RAY_ADDRESS")
    if not starts_one:
        kwargs.pop("include_dashboard", None)
        kwargs.pop("num_cpus", None)
    else:
        # a new local instance (never attach silently to whatever `ray start` cluster this machine runs), on
        # loopback: Ray would replace 127.0.0.1 by the machine's outward address, not 127.0.0.2
        address = "local"
        kwargs.setdefault("_node_ip_address", LOOPBACK_NODE_IP)
        # token auth on with a private (0600) token, so Ray neither writes a world-readable one nor warns; no
        # metrics exporter on all interfaces (see ray_security)
        enable_token_auth()
        disable_metrics_export()
    sigterm = signal.getsignal(signal.SIGTERM)
    # A Ray started here runs its workers at this process's niceness (the raylet has ours). Ray's default renices
    # them by 15, below every other job of a shared machine: against other users' busy processes a replacement
    # actor then got a few percent of a core and missed its first round's deadline (docs/figures.md, known
    # limits). A value the caller set wins; a cluster's nodes keep their own.
    niceness = os.environ.get(NICENESS)
    if starts_one:
        os.environ.setdefault(NICENESS, "0")
    try:
        ray.init(address=address, **kwargs)
    finally:
        if niceness is None:
            os.environ.pop(NICENESS, None)
    # Ray's core installs a C-level SIGTERM handler in the driver that aborts (SIGABRT, no `finally`, no
    # checkpoint); a Python handler set before (ldpfed.util.signals.interruptible) is put back so SIGTERM stops cleanly.
    if callable(sigterm) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, sigterm)
    return True
