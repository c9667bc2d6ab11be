"""Attacks on the server's aggregation, as the stress job mounts them.

Out of the domain (`out_of_domain`): a copy of an honest message that no honest population can send; a shard must
reject it. Within the domain (`IN_DOMAIN_ATTACKS`, one function per algorithm): valid-looking messages chosen to
pull the estimate one way; a shard must accept them (LDP protocols are manipulable within the domain), and
`poisoned_run` measures how far they move a run (`drive` with `PoisonedBackend`).

Layering: above the engine (it imports the engine and the algorithms); nothing in the engine, the algorithms or
the mechanisms imports it.
"""
from __future__ import annotations

import numpy as np

from ldpfed.config import RunConfig
from ldpfed.engine.core import PopulationRow, population_users, simulate_population
from ldpfed.engine.driver import Backend, drive
from ldpfed.engine.ray_shard import ShardCore, make_plan


# ---- out of the domain: what a shard must reject -----------------------------------------------------------------

def _beyond_the_bound(flat, user, entry, reach, domain):
    flat[user, entry] = 10 * reach + 1


def _inside_the_ball(flat, user, entry, reach, domain):
    """A sphere field's row (l2-ball output, unit direction) scaled by 0.5; another field: far beyond its bound."""
    if domain.radius is not None:
        flat[user] *= 0.5
    else:
        flat[user, entry] = 1e6 * reach + 1


def _scaled_up(flat, user, entry, reach, domain):
    """The whole field of every user times 1e6, plus 1e6 (never all zeros)."""
    flat *= 1e6
    flat += 1e6


OUT_OF_DOMAIN_KINDS = (_beyond_the_bound, _inside_the_ball, _scaled_up)


def out_of_domain(payload: dict, domains: dict, users, j: int, rng) -> dict:
    """A copy of a per-user payload (population layout: whole messages) that no honest population can send: field
    j % (number of fields), kind j % 3 of OUT_OF_DOMAIN_KINDS on one random (user, entry); a public field is
    changed instead whatever the kind (an integer one, e.g. an arm index: set to 10 x its bound + 1; an exact
    one, e.g. a public count: + 1)."""
    bad = {f: np.array(v, copy=True) for f, v in payload.items()}
    fields = sorted(bad)
    field = fields[j % len(fields)]
    value, domain = bad[field], domains[field]
    flat = value.reshape(len(value), -1)
    user, entry = int(rng.integers(len(value))), int(rng.integers(flat.shape[1]))
    reach = float(np.max(np.abs(np.concatenate([domain.low, domain.high])))) if domain.bounded else 1.0
    if not np.issubdtype(value.dtype, np.floating):
        flat[user, entry] = int(10 * reach + 1)
    elif domain.exact is not None:
        flat[user, entry] += 1
    else:
        OUT_OF_DOMAIN_KINDS[j % len(OUT_OF_DOMAIN_KINDS)](flat, user, entry, reach, domain)
    return bad


# ---- within the domain: what a shard must accept -----------------------------------------------------------------
# attack(algo, env, messages, users, bad) replaces, in place, the messages of the users `bad` (boolean).

def sphere_point(algo, env, messages, users, bad) -> None:
    """ldp-sgd: every l2-ball output the same point of the sphere (theta <- theta - eta Z moves against the truth);
    under the central model, the same point of the clipping ball (a mean is a clipped row)."""
    direction = env.theta / np.linalg.norm(env.theta)
    domain = algo.cached_domains()["Z"]
    messages["Z"][bad] = (domain.radius if domain.radius is not None else domain.max_radius) * direction


def tail_bound(algo, env, messages, users, bad) -> None:
    """ldp-ols: u at the Gaussian tail bound of every coordinate, against the sign of the truth."""
    high = algo.message_domains()["u"].high
    messages["u"][bad] = -high * np.where(env.theta >= 0, 1.0, -1.0)


def demote_the_best_arm(algo, env, messages, users, bad) -> None:
    """klucb-cf family: feedback 0 when the pulled arm is the best arm of the moment, 1 otherwise (bits in the
    pulled slot: in the domain): the best arm is demoted, the others promoted."""
    pulls = messages["pulls"][bad]
    best = np.argmax(env.means_at(users[bad]), axis=1)
    messages["feedback"][bad] = pulls * (np.argmax(pulls, axis=1) != best)[:, None]


IN_DOMAIN_ATTACKS = {"ldp-sgd": sphere_point, "ldp-ols": tail_bound, "sw-klucb-cf": demote_the_best_arm,
                     "klucb-cf": demote_the_best_arm}


# ---- under secure aggregation: what no shard can check -------------------------------------------------------------
# A shard sees masked residues, uniform in Z_m whatever the user put in: an attacker adds any vector it likes to its
# share of the sum, and the masks still cancel. masked_shift(algo, env, messages, users, bad, boost) adds, to each
# attacker's masked message, `boost` times the largest pull the central model's shard would let through (the same
# direction as the in-domain attack: ldp-ols's u at its data bound, against the truth's signs; ldp-sgd's Z the
# clipping ball's point along the truth, at the round's largest step), quantized as the users quantize.
def _secagg_pull(algorithm: str, algo, env, users) -> dict:
    sign = np.where(env.theta >= 0, 1.0, -1.0)
    declared = algo._fields
    if algorithm == "ldp-ols":
        twin, field = algo.central["u"], declared["u"]
        bound = twin.output_domain(field.shape, field.data_bound, **field.schedule).data_high
        return {"u": -bound * sign}
    if algorithm == "ldp-sgd":
        weight = float(np.max(algo.round_weights(int(users.min()), int(users.max()) + 1)[0]))
        return {"Z": weight * algo.central["Z"].clip_rows[0] * env.theta / np.linalg.norm(env.theta)}
    raise ValueError(f"no secure-aggregation attack written for {algorithm}")


def masked_shift(algo, env, messages, users, bad, boost: float) -> None:
    trust, sent = algo.trust, algo.sum_layout()
    pull = _secagg_pull(algo.name, algo, env, users)
    start = (int(users.min()) // algo.config.round_size) * algo.config.round_size
    scales = trust._scales(algo, start, min(start + algo.config.round_size, algo.config.users))
    bits = algo.secagg.bits
    for field, value in pull.items():
        part = sent.slices[field]
        shift = np.rint(boost * np.asarray(value).reshape(-1) * scales[part]).astype(np.int64)
        residues = np.asarray(messages[field][bad], dtype=np.float64).reshape(int(bad.sum()), -1).astype(np.uint64)
        moved = (residues + shift.astype(np.uint64)) & np.uint64((1 << bits) - 1)
        messages[field][bad] = moved.astype(np.float64).reshape(messages[field][bad].shape)


def in_domain_attack(algorithm: str):
    try:
        return IN_DOMAIN_ATTACKS[algorithm]
    except KeyError:
        raise ValueError(f"no in-domain attack written for {algorithm}") from None


class Rejected(Exception):
    """A shard rejected a round's message (the attack left the domain)."""

    def __init__(self, round_index: int, reasons: dict, regret: float):
        super().__init__(f"round {round_index} rejected: {reasons}")
        self.round_index, self.reasons, self.regret = round_index, reasons, regret


class PoisonedBackend(Backend):
    """One population (config.populations == 1): each round its users' per-user messages, the attackers'
    replaced by the algorithm's in-domain attack, folded by a server shard (`ShardCore`, per-user mode, domain
    checks on) as a client's message; the shard's total is the round's aggregate. A rejected message raises
    `Rejected` (with the regret of the rounds before it)."""

    name = "poisoned"

    def __init__(self, attackers: np.ndarray, boost: float = 1.0):
        self.attackers, self.boost = attackers, boost

    def open(self, config, algo, env, first_round):
        if config.populations != 1:
            raise ValueError("PoisonedBackend simulates one population")
        self.config, self.algo, self.env = config, algo, env
        if algo.trust_model().server_view == "masked":      # the shards see masked residues only
            self.attack = lambda algo, env, messages, users, bad: masked_shift(algo, env, messages, users, bad,
                                                                               self.boost)
        else:
            self.attack = in_domain_attack(config.algorithm)
        self.plan = make_plan(algo, config, 1, "per-user", "population")
        self.core = ShardCore(self.plan, 0, algo)
        self.regret = 0.0

    def simulate(self, model, round_index, start, stop):
        users = population_users(start, stop, 0, 1)
        messages, regret, metrics = simulate_population(self.algo, self.env, model, self.config.seed, round_index, 0,
                                                        users, pre_aggregate=False)
        bad = self.attackers[users]
        if bad.any():
            self.attack(self.algo, self.env, messages, users, bad)
        self.core.publish(round_index, model)
        if self.core.fold([(self.config.algorithm, round_index, 0, messages)]) != (1, 0):
            raise Rejected(round_index, dict(self.core.rejected_by_reason), self.regret)
        self.regret += regret
        return self.plan.assemble([self.core.collect(round_index)]), [
            PopulationRow.of(0, users, messages, regret, metrics)]


def poisoned_run(algorithm: str, fraction: float, users: int, round_size: int, seed: int, boost: float = 1.0,
                 **setting) -> dict:
    """One run in which `fraction` of the users (a fixed random set per seed, nested as the fraction grows) send
    the algorithm's in-domain attack. Returns regret, estimate (None if the algorithm has none), its error,
    attackers, rejected (messages the shard rejected), round_size, and ok (False: a round was rejected, the run
    stopped there: regret is that of the rounds before it, reasons the shard's). setting: RunConfig fields (under
    trust "secagg" the attack is masked_shift at `boost`)."""
    config = RunConfig(algorithm, users=users, round_size=round_size, populations=1, seed=seed, **setting)
    attackers = np.random.default_rng([seed, 12]).permutation(users) < round(fraction * users)
    backend = PoisonedBackend(attackers, boost)
    out = {"attackers": int(attackers.sum()), "round_size": config.round_size}
    try:
        result = drive(config, backend)
    except Rejected as stop:
        return {**out, "regret": stop.regret, "estimate": None, "error": None, "rejected": backend.core.rejected,
                "ok": False, "round": stop.round_index, "reasons": stop.reasons}
    estimate = backend.algo.estimate(result.state)
    return {**out, "regret": result.summary["final_regret"],
            "estimate": None if estimate is None else np.asarray(estimate),
            "error": backend.env.estimation_error(estimate) if estimate is not None else None,
            "rejected": backend.core.rejected, "ok": True}
