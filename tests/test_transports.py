"""The Ray engine's two transports. The default, direct (a flat round's messages over authenticated sockets,
ldpfed.engine.channels), runs test_ray_engine.py's equality tests; here: Ray calls (transport "ray") give the same
results as run_local for any actors, shards and mode and for a sample of algorithms; which runs use which transport,
and the fall back to Ray calls when the channels cannot open; bad options refused; a wrong key refused; an actor's
error raised in the coordinator. Faults over both transports (killed and frozen actors) are in test_faults.py."""
import socket
import threading
import time
from multiprocessing import AuthenticationError

import numpy as np
import pytest

from ldpfed.algorithms import REGISTRY, make_algorithm
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.engine.channels import ChannelBroken, RemoteError, Serving, as_ready, connect, new_key, receive
from ldpfed.envs import make_env
from ldpfed.util.errors import ConfigError
from test_ray_engine import LDP, assert_same, run_ray_unreserved, small


@pytest.mark.parametrize("algorithm", LDP[:1])
def test_ray_calls_transport_equals_single_process_for_any_shards_actors_and_mode(ray_session, algorithm):
    config = small(algorithm)
    local = run_local(config)
    spec = make_algorithm(make_env(config), config).message_spec()
    for actors, shards, mode, layout in [(3, 4, "pre-aggregated", None), (2, 3, "per-user", "block")]:
        remote = run_ray_unreserved(config, actors=actors, shards=shards, mode=mode, layout=layout, transport="ray")
        assert_same(local, remote)
        s = remote.summary
        assert (s["transport"], s["actors"], s["shards"], s["mode"], s["groups"]) == (
            "ray", actors, shards, mode, actors)
        assert s["rejected_messages"] == 0 and s["recoveries"] == 0
        # every (population, round) message folded once per shard that owns some of its keys, as over Ray calls
        per_round = config.populations if s["shard_layout"] == "population" else config.populations * min(
            shards, sum(int(np.prod(v)) for v in spec.values()))
        assert s["shard_messages"] == config.rounds * per_round
    for key in local.state:
        np.testing.assert_array_equal(local.state[key], remote.state[key])


# every algorithm goes over the default (direct) transport in test_ray_engine.py, and the transports carry the same
# objects: here over Ray calls, those whose shards check published choices (the scheduled arms of ldp-mab-ucb and
# sw-klucb-cf) against the model passed in the fold call
SAMPLE = ["ldp-mab-ucb", "sw-klucb-cf"]


def test_sample_of_algorithms_over_ray_calls(ray_session):
    # per-user mode: the shards check every user's message
    for algorithm in [name for name in SAMPLE if name in REGISTRY]:
        config = RunConfig(algorithm, users=150, round_size=30, populations=3, seed=2, delta=0.05)
        remote = run_ray_unreserved(config, actors=2, shards=2, mode="per-user", transport="ray")
        assert remote.summary["transport"] == "ray"
        assert_same(run_local(config), remote)
        assert remote.summary["rejected_messages"] == 0, algorithm


def test_direct_transport_bad_options(ray_session):
    config = small("uniform", users=120, round_size=40, populations=2)
    for options, field in [({"transport": "tcp"}, "transport"), ({"transport": "direct", "group_size": 2},
                                                                 "group_size")]:
        with pytest.raises(ConfigError) as error:
            run_ray_unreserved(config, **options)
        assert error.value.field == field
    shuffled = small(LDP[0] if LDP else "uniform", trust="shuffle", trust_options={"shufflers": 2})
    with pytest.raises(ConfigError, match="shuffler actors") as error:
        run_ray_unreserved(shuffled, mode="per-user", transport="direct")
    assert error.value.field == "transport"


def test_which_transport_a_run_uses(ray_session, monkeypatch):
    from ldpfed.engine import ray_rounds

    config = small("uniform", users=120, round_size=40, populations=3)
    monkeypatch.setattr(ray_rounds, "TREE_FROM_ACTORS", 2)    # the automatic size would make groups of 2
    # the default is direct, and flat: the coordinator writes to each actor's channel, no tree
    assert [run_ray_unreserved(config, actors=3).summary[key] for key in ("transport", "groups")] == ["direct", 3]
    # over Ray calls, the automatic tree; a tree asked for is over Ray calls; so is the shuffle trust model
    assert run_ray_unreserved(config, actors=3, transport="ray").summary["groups"] == 2
    assert run_ray_unreserved(config, actors=3, group_size=2).summary["transport"] == "ray"
    if LDP:
        shuffled = small(LDP[0], users=120, round_size=40, trust="shuffle", trust_options={"shufflers": 2})
        assert run_ray_unreserved(shuffled, actors=2, mode="per-user").summary["transport"] == "ray"


def test_the_default_transport_falls_back_to_ray_calls_when_its_channels_cannot_open(ray_session, monkeypatch):
    # e.g. a firewall between the nodes' processes: the coordinator cannot connect
    from ldpfed.engine import ray_rounds
    from ldpfed.engine.ray_engine import RunFault

    def refused(address, key):
        raise ConnectionRefusedError(f"connecting to {tuple(address)} refused")

    monkeypatch.setattr(ray_rounds, "connect", refused)      # where the direct transport connects
    config = small(LDP[0] if LDP else "uniform", users=120, round_size=40, populations=2)
    with pytest.warns(RuntimeWarning, match="goes on with Ray calls"):
        remote = run_ray_unreserved(config, actors=2)
    assert_same(run_local(config), remote)
    assert remote.summary["transport"] == "ray" and "refused" in remote.summary["transport_fallback"]
    assert remote.summary["recoveries"] == 0
    # asked for by name, it does not fall back: a fault, recovered up to max_recoveries, then the run fails
    with pytest.raises(RunFault, match="refused"):
        run_ray_unreserved(config, actors=2, transport="direct", max_recoveries=1)


def _serve_one(serving, handler):
    """Accept one connection on `serving` and pass it to handler on the serving thread; errors go to `errors`."""
    errors = []

    def serve():
        try:
            handler(serving.accept())
        except BaseException as error:
            errors.append(error)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread, errors


def test_a_channel_refuses_a_wrong_key_both_ways():
    key = new_key()
    serving = Serving("127.0.0.1", key)
    try:
        thread, errors = _serve_one(serving, lambda conn: conn.recv())
        with pytest.raises(AuthenticationError):
            connect(serving.address, new_key())       # an outsider with another key never gets a message through
        thread.join(5)
        assert len(errors) == 1 and isinstance(errors[0], AuthenticationError)
        # the right key: a message goes both ways
        thread, errors = _serve_one(serving, lambda conn: conn.send(("echo", conn.recv())))
        conn = connect(serving.address, key)
        conn.send(41)
        assert conn.recv() == ("echo", 41)
        thread.join(5)
        assert errors == []
        conn.close()
    finally:
        serving.stop()


def test_an_actors_error_is_raised_in_the_coordinator_and_a_closed_channel_is_a_fault():
    key = new_key()
    serving = Serving("127.0.0.1", key)
    peer = []

    def serve():
        peer.append(serving.accept())
        peer[0].recv()
        raise ValueError("a bug in the round")      # Serving sends the traceback to the coordinator

    serving.start(serve, lambda text: peer[0].send(RemoteError(text)))
    conn = connect(serving.address, key)
    conn.send("round")
    with pytest.raises(RemoteError, match="ValueError: a bug in the round"):
        receive([conn], 10.0, lambda n: TimeoutError(n))
    serving.thread.join(5)
    assert not serving.thread.is_alive()           # the thread ended and closed its side
    with pytest.raises(ChannelBroken):
        receive([conn], 10.0, lambda n: TimeoutError(n))
    conn.close()


def test_a_shard_gets_its_batches_in_the_order_they_arrive():
    # as_ready: what a shard's channel loop folds from (ShardCore adds them in actor order whatever this order is:
    # test_ray_engine's test_shard_folds_in_population_order_whatever_the_arrival_order)
    from multiprocessing import Pipe

    pairs = [Pipe() for _ in range(3)]
    got = as_ready([ours for ours, _ in pairs])
    pairs[2][1].send("third actor's batch")
    assert next(got) == "third actor's batch"
    pairs[0][1].send("first actor's batch")
    assert next(got) == "first actor's batch"
    pairs[1][1].send("second actor's batch")
    assert list(got) == ["second actor's batch"]     # one message from each connection, then it ends
    pairs[0][1].send("next round's")                  # not read: it belongs to the next round's loop
    assert pairs[0][0].recv() == "next round's"


def test_channels_listen_in_the_port_range_asked_for(monkeypatch):
    from ldpfed.engine import channels

    with socket.socket() as probe:     # a free port, and the one after it (most likely free too)
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    monkeypatch.setenv(channels.PORTS_VAR, f"{free}-{free + 1}")
    first = Serving("127.0.0.1", new_key())
    try:
        assert first.address[1] == free
        second = Serving("127.0.0.1", new_key())       # the first port is taken: the next one
        assert second.address[1] == free + 1
        with pytest.raises(OSError, match="no free port"):
            Serving("127.0.0.1", new_key())
        second.stop()
    finally:
        first.stop()
    monkeypatch.setenv(channels.PORTS_VAR, "twenty")
    with pytest.raises(OSError, match="expected a range"):
        Serving("127.0.0.1", new_key())


def test_a_watchdog_ends_a_send_blocked_on_a_peer_that_stopped_reading_and_a_handshake_that_never_comes():
    from ldpfed.engine.channels import watchdog

    key = new_key()
    serving = Serving("127.0.0.1", key)
    accepted = threading.Event()

    def serve():
        serving.accept()
        accepted.set()
        threading.Event().wait(30)     # never reads: a frozen peer

    serving.start(serve, lambda text: None)
    conn = connect(serving.address, key)
    assert accepted.wait(5)
    big = b"x" * (64 * 2**20)          # far more than the sockets buffer
    started = time.perf_counter()
    with pytest.raises(OSError):
        with watchdog([conn], 0.5):
            conn.send_bytes(big)
    assert time.perf_counter() - started < 10
    serving.stop(timeout=1)
    conn.close()
    # a listener that accepts the TCP connection and never starts the handshake
    with socket.create_server(("127.0.0.1", 0)) as silent:
        from ldpfed.engine import channels

        started = time.perf_counter()
        with pytest.raises((EOFError, OSError)):
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(channels, "CONNECT_TIMEOUT_S", 0.5)
                connect(silent.getsockname()[:2], key)
        assert time.perf_counter() - started < 10


def test_a_silent_channel_reaches_the_timeout_and_stop_ends_a_blocked_thread():
    key = new_key()
    serving = Serving("127.0.0.1", key)
    blocked = threading.Event()

    def serve():
        conn = serving.accept()
        blocked.set()
        conn.recv()          # blocks until stop() shuts the socket down

    serving.start(serve, lambda text: None)
    conn = connect(serving.address, key)
    with pytest.raises(TimeoutError):
        receive([conn], 0.2, lambda n: TimeoutError(f"{n} silent"))
    assert blocked.wait(5)
    serving.stop(timeout=5)
    assert not serving.thread.is_alive()
    with pytest.raises(OSError):   # the listening socket is closed too
        socket.create_connection(serving.address, timeout=1)
    conn.close()
