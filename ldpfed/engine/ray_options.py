"""The Ray engine's options (`RayOptions`), checked once when they are made, and the checks that need the run's
config (`check_mode`, `check_transport`: before Ray starts, and again when a backend opens)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ldpfed.trust import trust_model
from ldpfed.engine.ray_shard import MODES
from ldpfed.util.errors import ConfigError, integer

# How a round's messages travel (see RayBackend's transport).
TRANSPORTS = ("ray", "direct")
# How a run's placement group lays its bundles (one per actor) on the nodes: Ray's strategies of those names; "none":
# no group, the actors ask for no CPUs (see RayBackend)
PLACEMENTS = {"spread": "SPREAD", "pack": "PACK", "none": None}
# Ray counts fractional resources in steps of 1/10,000
CPU_STEP = 1e-4


def ray_address(value, where: str = "address") -> str | None:
    """The Ray cluster a driver joins, checked: None (RAY_ADDRESS if set, else a new local Ray), "auto", "local",
    host:port (the cluster's GCS) or ray://host:port (Ray Client); returned as given (stripped). With None or "auto"
    ray.init reads RAY_ADDRESS, which is checked the same way. An HTTP address is the dashboard's or the jobs API's,
    which `ray job submit` takes and ray.init does not (it would fail with a traceback): a ConfigError naming `where`
    (or RAY_ADDRESS) says which address to give instead."""
    if value is not None:
        value = _checked_address(value, where)
    if value in (None, "auto") and os.environ.get("RAY_ADDRESS"):
        _checked_address(os.environ["RAY_ADDRESS"], "RAY_ADDRESS")
    return value


def _checked_address(value, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(where, value, "a Ray address such as auto, 127.0.0.2:6379 or ray://host:10001")
    if value.strip().lower().startswith(("http://", "https://")):
        raise ConfigError(where, value, "an HTTP address (the dashboard's or the jobs API's, as in the env.sh of "
                                        "cluster/local_cluster.py, for `ray job submit`); a driver joins the "
                                        "cluster's GCS address: auto, or host:port as `python "
                                        "cluster/local_cluster.py status` prints it")
    return value.strip()


def _check_seconds(name, value, zero: bool = False) -> None:
    """ConfigError naming `name` unless value is None or a number of seconds > 0 (>= 0 with zero=True)."""
    if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                  and (value >= 0 if zero else value > 0)):
        raise ConfigError(name, value, f"must be a number of seconds {'>=' if zero else '>'} 0")


def _check_cpus(name, value) -> float | None:
    """None (what fits), or a number of CPUs > 0 that Ray can count (a multiple of 1/10,000)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not value > 0 \
            or abs(round(value / CPU_STEP) * CPU_STEP - value) > 1e-9:
        raise ConfigError(name, value, "must be a number of CPUs > 0, in steps of 0.0001 (e.g. 0.5, 1, 2)")
    return float(value)


LATE = ("fold", "drop")       # deadline mode: what happens to a population's messages that miss their round


@dataclass(frozen=True)
class RayOptions:
    """Everything a Ray run is asked for besides its config (RayBackend's doc says what each one does). Made once,
    checked once (ConfigError naming the option); normalized: group_size 0 becomes 1, seconds become floats."""

    actors: int = 2
    shards: int = 1
    mode: str = "pre-aggregated"
    max_in_flight: int | None = None
    layout: str | None = None
    round_timeout: float | None = None
    timeout_factor: float = 10.0
    min_round_timeout: float = 5.0
    first_round_timeout: float = 120.0
    probe_timeout: float = 2.0
    max_recoveries: int = 10
    spares: int = 0
    group_size: int | None = None
    transport: str | None = None
    rebalance_every: float | None = 30.0
    actor_cpus: float | None = None
    shard_cpus: float | None = None
    placement: str = "spread"
    placement_timeout: float | None = None
    # deadline mode (RayBackend): a round closes deadline_s seconds after it is sent; a population's messages not
    # in by then are folded into the round they arrive in ("fold") or lost ("drop"). Stragglers for the systems
    # question: straggle_share of the population actors (seeded) delay each round's messages by straggle_s.
    deadline_s: float | None = None
    late: str = "fold"
    straggle_share: float = 0.0
    straggle_s: float = 0.0
    deadline_record: str | None = None    # where the record of late population rounds is written (JSON)

    def __post_init__(self):
        def put(name, value):     # a frozen dataclass normalizes its own fields here only
            object.__setattr__(self, name, value)

        put("actors", integer("actors", self.actors))
        put("shards", integer("shards", self.shards))
        if self.mode not in MODES:
            raise ConfigError("mode", self.mode, f"choose from {list(MODES)}")
        if self.layout not in (None, "block", "population"):
            raise ConfigError("layout", self.layout, "choose from ['block', 'population']")
        if self.max_in_flight is not None:
            put("max_in_flight", integer("max_in_flight", self.max_in_flight))
        # None: chosen by the number of actors (`auto_group_size`); 0 or 1: the flat shape
        if self.group_size is not None:
            put("group_size", max(1, integer("group_size", self.group_size, 0)))
        if self.transport not in (None, *TRANSPORTS):
            raise ConfigError("transport", self.transport, f"choose from {list(TRANSPORTS)}")
        if self.transport == "direct" and self.tree:
            raise ConfigError("group_size", self.group_size, "the direct transport runs flat rounds (group_size 1): "
                                                             "the coordinator's work per actor is one socket write")
        for name in ("round_timeout", "timeout_factor", "min_round_timeout", "first_round_timeout", "probe_timeout"):
            _check_seconds(name, getattr(self, name))
        for name in ("timeout_factor", "min_round_timeout", "first_round_timeout", "probe_timeout"):
            put(name, float(getattr(self, name)))
        _check_seconds("rebalance_every", self.rebalance_every, zero=True)     # None: never
        put("max_recoveries", integer("max_recoveries", self.max_recoveries, 0))
        put("spares", integer("spares", self.spares, 0))
        put("actor_cpus", _check_cpus("actor_cpus", self.actor_cpus))
        put("shard_cpus", _check_cpus("shard_cpus", self.shard_cpus))
        if self.placement not in PLACEMENTS:
            raise ConfigError("placement", self.placement, f"choose from {list(PLACEMENTS)}")
        if self.placement == "none" and (self.actor_cpus is not None or self.shard_cpus is not None):
            raise ConfigError("placement", self.placement, "reserves no CPUs: leave actor_cpus and shard_cpus unset")
        _check_seconds("placement_timeout", self.placement_timeout)       # None: as long as it takes
        _check_seconds("deadline_s", self.deadline_s)
        if self.late not in LATE:
            raise ConfigError("late", self.late, f"choose from {list(LATE)}")
        if not (isinstance(self.straggle_share, (int, float)) and 0 <= self.straggle_share <= 1):
            raise ConfigError("straggle_share", self.straggle_share, "must be a fraction in [0, 1]")
        _check_seconds("straggle_s", self.straggle_s, zero=True)
        put("straggle_share", float(self.straggle_share))
        put("straggle_s", float(self.straggle_s))
        if self.deadline_s is not None:
            put("deadline_s", float(self.deadline_s))
        if self.deadline_s is not None or self.stragglers:
            if self.mode != "pre-aggregated" or self.transport == "direct" or self.tree:
                raise ConfigError("deadline_s" if self.deadline_s is not None else "straggle_s",
                                  self.deadline_s if self.deadline_s is not None else self.straggle_s, "deadline mode runs pre-aggregated flat rounds over "
                                                                 "Ray calls: --mode pre-aggregated, --transport ray, "
                                                                 "group_size 1")

    @property
    def stragglers(self) -> bool:
        """Stragglers are injected (some actors' messages leave them late)."""
        return self.straggle_share > 0 and self.straggle_s > 0

    @property
    def tree(self) -> bool:
        """A tree shape was asked for (group_size above 1)."""
        return (self.group_size or 1) > 1


def check_mode(config, mode: str) -> None:
    """ConfigError naming mode when the run's trust model cannot run in it (before Ray starts, and at open)."""
    shuffles = trust_model(config).shuffles
    if shuffles and mode != "per-user":
        raise ConfigError("mode", mode, "the shuffle trust model runs in per-user mode: its shuffler actors mix the "
                                        "users' messages, which a population's sum would bypass; use --mode per-user")


def check_deadline(config, options) -> None:
    """ConfigError naming deadline_s when the run cannot close its rounds at a deadline (before Ray starts)."""
    if options.deadline_s is None:
        return      # stragglers alone change no message: any run takes them
    from ldpfed.federation import federation_model

    where = trust_model(config)
    if where.shuffles or where.noise_at == "shares":
        raise ConfigError("deadline_s", options.deadline_s, f"the {config.trust} trust model accounts on a round's "
                                                            f"whole batch or sum: a round closed without its late "
                                                            f"populations breaks it; run it without a deadline")
    if federation_model(config).late:
        raise ConfigError("deadline_s", options.deadline_s, f"the {config.federation} federation model delays "
                                                            f"messages itself; a deadline run replays under it only "
                                                            f"through its record (--federation replay)")


def check_transport(config, transport: str) -> None:
    """ConfigError naming transport when the run cannot use it (before Ray starts, and at open)."""
    if transport == "direct" and trust_model(config).shuffles:
        raise ConfigError("transport", transport, "the shuffle trust model's rounds go through its shuffler actors "
                                                  "over Ray; use transport 'ray'")
