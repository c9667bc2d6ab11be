"""Round channels: the messages of a flat round over authenticated sockets instead of Ray calls (transport "direct").

Why: a Ray actor call costs ~0.6 ms of CPU in the caller and as much in the actor on the project's 2-core VM
(`jobs/bench_engine.py` prints it). A flat round makes one per population actor and one per shard: at B = 10,000
users per round that is half the users' own work again (docs/scaling.md). A message on a channel costs tens of us.

What stays with Ray: placing, configuring, probing, recovering and measuring the actors. The channels carry only
the rounds (`RayBackend` with transport="direct"):
* the coordinator sends each population actor (model, round, start, stop), and each shard (round, published model);
* a population actor runs the round (`PopulationActor.run_round`, the same code as over Ray), sends each shard its
  objects for that shard and the coordinator its metrics;
* a shard folds its populations' objects as they arrive, adding them in actor order (`ShardActor.fold_round`, the
  same checks of every message)
  and sends its totals to the coordinator.
So the results are the Ray transport's, bit for bit.

A channel is a `multiprocessing.connection.Connection` on a TCP socket, opened with the HMAC challenge both ways
under a key made for the run (`new_key`) and handed to the actors through Ray's own calls: only the run's processes
can connect. Each actor serves its channels on one thread (`Serving`).
Faults: a channel that closes or fails mid-round raises `ChannelBroken` in the coordinator, a silent one reaches the
round's timeout; both are handled as a dead actor. The coordinator then closes every channel (each serving thread
ends), the usual recovery runs over Ray, and the channels are opened again.
"""
from __future__ import annotations

import os
import socket
import threading
import time
import traceback
from contextlib import contextmanager
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge, wait

CONNECT_TIMEOUT_S = 10.0
# The ports a channel may listen on, e.g. "20000-20999" (set in the environment of every node's `ray start`, so a
# firewall can allow that range between the nodes); unset: any free port.
PORTS_VAR = "LDPFED_CHANNEL_PORTS"


def listen(host: str) -> socket.socket:
    """A listening socket on `host`: on a free port, or on the first free one of LDPFED_CHANNEL_PORTS."""
    spec = os.environ.get(PORTS_VAR, "").strip()
    if not spec:
        return socket.create_server((host, 0), backlog=128)
    try:
        low, high = (int(part) for part in spec.split("-"))
    except ValueError:
        raise OSError(f"{PORTS_VAR}={spec!r}: expected a range such as 20000-20999") from None
    for port in range(low, high + 1):
        try:
            return socket.create_server((host, port), backlog=128)
        except OSError:
            continue
    raise OSError(f"no free port in {PORTS_VAR}={spec}")


class ChannelBroken(Exception):
    """A round channel that closed or failed (its actor or its node died): handled as a death."""


class RemoteError(RuntimeError):
    """An exception raised by an actor while serving a round (a bug, not a fault): the run fails with its traceback."""


def new_key() -> bytes:
    return os.urandom(32)


def _nodelay(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # small messages go at once
    return sock


def connect(address, key: bytes) -> Connection:
    """A client connection to `address`, authenticated both ways with `key` (within CONNECT_TIMEOUT_S: a peer that
    accepts and then never answers, e.g. a frozen process, fails it)."""
    sock = socket.create_connection(tuple(address), timeout=CONNECT_TIMEOUT_S)
    sock.settimeout(None)
    conn = Connection(_nodelay(sock).detach())
    with watchdog([conn], CONNECT_TIMEOUT_S):
        answer_challenge(conn, key)
        deliver_challenge(conn, key)
    return conn


@contextmanager
def watchdog(conns, seconds: float):
    """Shut `conns` down if the block has not ended within `seconds`: a call blocked on a peer that stopped reading or
    answering (a frozen process) then fails instead of waiting for ever. (A Connection's fd is blocking: a socket
    timeout cannot be used.)"""
    timer = threading.Timer(max(0.0, seconds), lambda: [_wake(conn) for conn in conns])
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _wake(conn) -> None:
    """Shut the socket under `conn` down, so that a thread blocked on it returns (closing the fd would not)."""
    try:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
    except (OSError, ValueError):
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


def close_all(conns) -> None:
    for conn in conns:
        _wake(conn)
        try:
            conn.close()
        except OSError:
            pass


class Serving:
    """An actor's channels: a listening socket on `host`, the connections it made or accepted, and the thread that
    serves them. `stop` shuts every socket down (the thread's blocking calls fail) and waits for the thread."""

    def __init__(self, host: str, key: bytes):
        self.key = key
        self.listener = _nodelay(listen(host))
        self.address = self.listener.getsockname()[:2]
        self.conns: list[Connection] = []
        self.thread: threading.Thread | None = None

    def accept(self) -> Connection:
        sock, _ = self.listener.accept()
        conn = Connection(_nodelay(sock).detach())
        self.conns.append(conn)
        deliver_challenge(conn, self.key)
        answer_challenge(conn, self.key)
        return conn

    def connect(self, address) -> Connection:
        conn = connect(address, self.key)
        self.conns.append(conn)
        return conn

    def start(self, serve, report) -> None:
        """Run serve() on the thread. A closed channel ends it quietly (the coordinator closed the round's channels);
        any other exception goes to report(text) first (the coordinator raises it), then ends it."""
        def run():
            try:
                serve()
            except (EOFError, OSError):
                pass
            except BaseException:
                try:
                    report(traceback.format_exc())
                except (EOFError, OSError):
                    pass
            finally:
                self._close()
        self.thread = threading.Thread(target=run, name="round-channel", daemon=True)
        self.thread.start()

    def _close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        close_all(self.conns)

    def stop(self, timeout: float = 10.0) -> None:
        self._close()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)


def as_ready(conns: list):
    """One message from each of `conns`, yielded in the order they arrive (a shard validates a batch while the next
    one is still being made; it adds them in actor order whatever the order it got them: `ShardCore.fold`). An
    error of a connection propagates (the serving thread ends)."""
    pending = list(conns)
    while pending:
        for conn in wait(pending):
            pending.remove(conn)
            yield conn.recv()


def receive(conns: list, deadline_s: float, on_timeout) -> list:
    """One message from each of `conns`, in their order, waiting at most deadline_s seconds in all (then
    on_timeout(pending count) is raised); ChannelBroken if one closes; RemoteError if one sends an actor's
    traceback."""
    end = time.perf_counter() + deadline_s
    got, pending = {}, list(conns)
    while pending:
        ready = wait(pending, timeout=max(0.0, end - time.perf_counter()))
        if not ready:
            raise on_timeout(len(pending))
        for conn in ready:
            try:
                message = conn.recv()
            except (EOFError, OSError) as error:
                raise ChannelBroken(f"a round channel closed: {type(error).__name__}: {error}") from error
            if isinstance(message, RemoteError):
                raise message
            got[conn] = message
            pending.remove(conn)
    return [got[conn] for conn in conns]
