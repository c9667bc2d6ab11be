"""The secure-aggregation trust model ("secagg"): distributed DP with discrete noise, the protocol simulated as it
runs (ldpfed.mechanisms.secagg holds the integers: quantization, Skellam shares, SecAgg+ masks).

No one is trusted with a single message, and the server learns only the sum of a round's messages:

* each user clips its data as under the central model (its mechanisms' means: unbiased), applies the aggregate's
  public weights or fold itself (`client_weighs`: the server can only add), scales each entry by the field's
  `scale` (divided by the round's largest public weight, so every round's sensitivity is the same), rounds it to
  an integer at random (unbiased; the sensitivity's inflation is accounted: `quantized_sensitivity`), adds its
  share of **Skellam** noise to every entry of its private fields, and masks the vector in Z_m, m = 2**bits, with
  the SecAgg+ masks of its ring neighbours (`mask`);
* the shards receive only masked vectors (uniform in Z_m whatever the data) and add them; the server's half
  removes the masks that did not cancel (the self masks of the users who sent, the pair masks of the users who
  dropped, from the shares of the neighbours still there: `unmask`), reads the sum as signed integers and divides
  by the scale.

Why Skellam: a sum of independent Skellam variables is Skellam, with the variances added, so the noise in a
round's sum is exactly Skellam of the variance of the shares that arrived, whatever the drop-outs (the distributed
discrete Gaussian's sum is only close to a discrete Gaussian). The accountant checks each field's claim against
that noise with the Skellam RDP bound of Agarwal, Kairouz and Liu (2021) (ldpfed.mechanisms.accounting).

Drop-outs are seeded per round: `dropout` of a round's users never send, `dropout_after` send and then do not
answer the unmasking (their data and noise are in the sum; their self masks come from their neighbours' shares).
Shares are calibrated for `min_survivors` of a round's users: a round with fewer senders carries less noise than
calibrated, and `below` decides: "refuse" the run before it starts (the drop-outs are a function of the seed), or
"report" it at the guarantee its worst round really gives (never a claim above the noise in the sum). A round in
which some secret has fewer responding holders than the threshold would abort: refused before the run, naming
`neighbours`.

What the shards can check: only that every entry of a masked vector is in Z_m. A poisoner's in-range message
reaches the sum unchecked (the price of not seeing messages); verifiable secure aggregation (norm proofs on the
masked inputs: RoFL, ELSA) is the remedy, not simulated here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ldpfed.mechanisms import accounting, secagg
from ldpfed.mechanisms.domains import Domain
from ldpfed.mechanisms.guarantee import Guarantee
from ldpfed.mechanisms.noise import FieldNoise
from ldpfed.trust.central import CentralTrust, around_steps_refusal, central_twins
from ldpfed.util.errors import ConfigError
from ldpfed.util.options import Option
from ldpfed.federation import federation_of
from ldpfed.federation.rounds import round_senders
from ldpfed.util.rng import derive

BELOW = ("refuse", "report")
# The default scale makes the rounding's variance (at most 1/4 per user and entry) at most this share of the
# Skellam noise's in a round's sum, and the rounding's inflation of the sensitivity (2 sqrt(dim) in L2) at most
# INFLATION_SHARE of the scaled one (the noise grows with the square of the sensitivity).
ROUNDING_SHARE = 0.01
INFLATION_SHARE = 0.05
FLOAT_BITS = 53      # the shards add residues as float64: exact while users x 2**bits < 2**53
WRAP_TARGET = 1e-9   # the default bits make a wrap-around anywhere in the run at most this likely


@dataclass(frozen=True)
class SkellamRelease:
    """One private field's release under secure aggregation, as the ledger states it: the Skellam noise really in a
    round's sum at the worst round (`variance`, quantized units) for one user's quantized contribution of
    sensitivity `l2` (and `l1`)."""

    guarantee: Guarantee
    variance: float
    l2: float
    l1: float

    def dp_event(self) -> dict:
        return {"noise": "skellam", "noise_variance": float(self.variance), "l1_sensitivity": float(self.l1),
                "nodes": 1}


@dataclass
class FieldPlan:
    """How one sent field (an aggregate field) is quantized and noised."""

    name: str
    source: str | None           # the message field whose private data it carries (None: public)
    scale: float                 # quantization scale at weight 1
    bound: float                 # |entry| of one user's contribution, real units, at weight 1
    variance: float = 0.0        # Skellam variance the round's sum is calibrated to carry (quantized units)
    l2: float = 0.0              # one user's quantized sensitivity (replace-one), L2 and L1
    l1: float = 0.0
    eps: float = 0.0
    delta: float = 0.0
    symmetric: bool = False      # a (..., d, d) field whose noise and rounding are mirrored (the upper triangle)


@dataclass
class Plan:
    """A run's secure aggregation: bits, neighbours, the fields' plans and the seeded drop-outs of every round."""

    bits: int
    neighbours: int              # 0: each round's default (ldpfed.mechanisms.secagg.default_neighbours)
    fields: dict                 # sent field -> FieldPlan
    key: int
    min_survivors: float
    worst_ratio: float           # min over rounds of (senders / users the shares are calibrated for), capped at 1
    worst_round: int
    wrap_bound: float
    users_per_round: int
    realized: dict = field(default_factory=dict)     # private field -> (eps, delta) at the worst round


def _weight_max(algo, start: int, stop: int, width: int) -> np.ndarray:
    """Entry-wise the largest |public weight| of the users [start, stop) on the message row (1 with none)."""
    return algo.round_weights(start, stop)[0] if algo.weighs() else np.ones(width)


class SecAggTrust(CentralTrust):
    """Secure aggregation with distributed Skellam noise (module doc)."""

    name = "secagg"
    about = ("secure aggregation: each user quantizes its clipped data, adds a share of discrete (Skellam) noise and "
             "masks it; the server learns only each round's sum, whose noise meets --eps/--delta")
    noise_at = "shares"
    server_view = "masked"
    client_weighs = True
    options = {
        "bits": Option(0, kind="int", low=0, high=secagg.MAX_BITS,
                       doc="the modulus m = 2**bits of the sums; 0: the fewest bits whose wrap-around anywhere in "
                           "the run is below 1e-9 (and users per round x 2**bits below 2**53)"),
        "scale": Option(0.0, low=0.0, doc="quantization scale of the clipped data (before the round's public "
                                          "weights); 0: the rounding's variance at most 1% of the noise's"),
        "neighbours": Option(0, kind="int", low=0,
                             doc="SecAgg+ neighbours of each user (even); 0: 2 ceil(log2 n), or more when the "
                                 "drop-outs need it for rounds not to abort"),
        "dropout": Option(0.0, low=0.0, high=0.5, doc="fraction of a round's users who drop before sending (seeded "
                                                      "per round)"),
        "dropout_after": Option(0.0, low=0.0, high=0.5, doc="fraction who send and then drop before the unmasking "
                                                            "(their data and noise are in the sum)"),
        "min_survivors": Option(1.0, low=0.0, high=1.0, low_open=True,
                                doc="the shares are calibrated so that this fraction of a round's users carries "
                                    "the whole noise"),
        "below": Option("refuse", kind="choice", choices=BELOW,
                        doc="a round with fewer senders than min_survivors: 'refuse' the run before it starts, or "
                            "'report' the guarantee its noise really gives"),
    }

    # ---- reach and build -------------------------------------------------------------------------------------------
    def refusal(self, algo) -> str | None:
        return around_steps_refusal(algo, "share among the users")

    def federation_refusal(self, federation) -> str | None:
        if federation.late:
            return ("a late message would join a later round's masked sum, whose masks and noise shares are that "
                    "round's users'; run it under a federation model without delays")
        return None

    def check(self, config) -> None:
        bits = config.trust_options["bits"]
        if bits and bits < 8:
            raise ConfigError("trust_options.bits", bits, "must be 0 (automatic) or at least 8")
        k = config.trust_options["neighbours"]
        if k % 2:
            raise ConfigError("trust_options.neighbours", k, "must be even (k/2 on each side of the ring)")

    def attach(self, algo) -> None:
        algo.central = central_twins(algo)
        algo.secagg = self._plan(algo)

    # ---- the plan --------------------------------------------------------------------------------------------------
    def _plan(self, algo) -> Plan:
        config, options = algo.config, algo.config.trust_options
        B, T = config.round_size, config.users
        sent = algo.sum_layout()
        sources = algo.central_sources()
        twins = algo.central
        declared = algo._fields or {}
        # each private field's (eps, delta): its local mechanism's; a pure-eps field (l2-ball, randomized response)
        # gets a share of the delta the other fields leave (Skellam is never pure)
        # (a row counts per_user times: a user's data reaches that many of the field's releases)
        rows = {key: twin.guarantee for key, twin in twins.items()}
        times = {row["message"]: int(row.get("per_user", 1)) for row in algo.ledger()}   # built, not yet attached
        spare = max(config.delta - sum(times[key] * g.delta for key, g in rows.items()), 0.0)
        pure = [key for key, g in rows.items() if g.delta == 0.0]
        if pure and spare <= 0.0:      # no delta left: every field's delta is re-split by its count
            budget = {key: (g.eps, config.delta / sum(times.values())) for key, g in rows.items()}
        else:
            share = spare / sum(times[key] for key in pure) if pure else 0.0
            budget = {key: (g.eps, g.delta if g.delta > 0 else share) for key, g in rows.items()}
        fields = {}
        for target in sent.names:
            source = sources.get(target)
            twin = twins.get(source) if source is not None else None
            shape = sent.shapes[target]
            if twin is None:          # a public field: rounded at scale 1, no noise
                domain = declared[source].make_domain() if source in declared else None
                bound = 1.0 if domain is None else float(np.max(np.abs([domain.data_low, domain.data_high])))
                fields[target] = FieldPlan(target, None, 1.0, bound if math.isfinite(bound) else 1.0)
                continue
            out = twin.output_domain(declared[source].shape, declared[source].data_bound, **declared[source].schedule)
            bound = float(np.max(np.abs([out.data_low, out.data_high])))
            size = int(np.prod(shape))
            symmetric = bool(twin.symmetric)
            dim = (size // shape[-1]) * (shape[-1] + 1) // 2 if symmetric else size
            l2_real, l1_real = self._sensitivities(twin, size)
            sigma = twin.scale if twin.noise == "gaussian" else math.sqrt(2.0) * twin.scale
            scale = options["scale"] or max(math.sqrt(B / 4.0 / ROUNDING_SHARE) / sigma,
                                            2.0 * math.sqrt(dim) / (INFLATION_SHARE * l2_real))
            l2, l1 = secagg.quantized_sensitivity(l2_real, l1_real, dim, scale)
            eps, delta = budget[source]
            variance = accounting.skellam_variance_for(eps, delta, l2, l1)
            fields[target] = FieldPlan(target, source, scale, bound, variance, l2, l1, eps, delta, symmetric)
        key = int(derive(config.seed, "secagg").integers(0, 2 ** 63))     # the masks' key
        ratio, worst = self._worst_round(config)
        plan = Plan(options["bits"], options["neighbours"], fields, key, options["min_survivors"], ratio, worst,
                    0.0, B)
        noisy = [f for f in fields.values() if f.source is not None]
        largest = max([f.variance for f in noisy] or [0.0])
        per_user = max(f.scale * f.bound + 1.0 for f in fields.values())
        per_user += max([math.sqrt(f.variance / self._calibrated(plan, B)) * 40.0 for f in noisy] or [0.0])
        entries, rounds = sent.width, config.rounds
        if not plan.bits:
            plan.bits = secagg.default_bits(B, per_user, largest * max(1.0, 1.0 / plan.min_survivors), entries,
                                            rounds, WRAP_TARGET)
        if B * 2.0 ** plan.bits >= 2.0 ** FLOAT_BITS:
            raise ConfigError("trust_options.bits", plan.bits,
                              f"{B:,} users per round x 2**{plan.bits} reaches 2**{FLOAT_BITS}, where the shards' "
                              f"float64 sums stop being exact; lower --round-size or the bits")
        plan.wrap_bound = rounds * secagg.wrap_probability(B, per_user, largest * max(1.0, 1.0 / plan.min_survivors),
                                                           entries, plan.bits)
        self._check_rounds(config, plan)
        for f in noisy:
            real = f.variance * min(ratio, 1.0)
            plan.realized[f.source] = (accounting.skellam_epsilon(real, f.l2, f.l1, f.delta), f.delta)
        if ratio < 1.0 and options["below"] == "refuse":
            n = self._round_size(config, worst)
            raise ConfigError("trust_options.min_survivors", options["min_survivors"],
                              f"round {worst}: {self._senders(config, worst).sum():,} of {n:,} users send, fewer "
                              f"than the {self._calibrated(plan, n):,} the noise shares are calibrated for; lower "
                              f"min_survivors (about 1 - dropout, with a margin) or give below=report")
        return plan

    @staticmethod
    def _sensitivities(twin, size: int) -> tuple[float, float]:
        """(L2, L1) of the change of one user's field between two inputs, from its central twin: an l2-ball's rows
        are clipped to the radius R (each row moves by at most 2 R in L2, 2 R sqrt(row) in L1), a Gaussian's
        sensitivity is L2 (L1 <= sqrt(entries) L2), a Laplace's L1 (L2 <= L1)."""
        if twin.clip_rows is not None:
            radius, dim = twin.clip_rows
            rows = max(1, size // int(dim))
            return 2.0 * radius * math.sqrt(rows), rows * 2.0 * radius * math.sqrt(dim)
        sens = float(twin.guarantee.sensitivity)
        return (sens, sens * math.sqrt(size)) if twin.guarantee.norm == "l2" else (sens, sens)

    @staticmethod
    def _round_size(config, r: int) -> int:
        start = r * config.round_size
        return min(config.round_size, config.users - start)

    @staticmethod
    def _calibrated(plan, n: int) -> int:
        """The users whose shares are calibrated to carry the round's whole noise."""
        return max(1, math.ceil(plan.min_survivors * n - 1e-9))

    @staticmethod
    def _flags(config, r: int) -> tuple[np.ndarray, np.ndarray]:
        """(sent, responded) of round r's users: seeded, the same on every engine and after a resume."""
        n = SecAggTrust._round_size(config, r)
        draws = derive(config.seed, "secagg", 1, r).random((2, n))
        options = config.trust_options
        sent = draws[0] >= options["dropout"]
        federation = federation_of(config)
        if not federation.ideal:    # the federation model's absent and lost users send no share either
            start = r * config.round_size
            senders = round_senders(federation, r, start, start + n, config.populations)
            sent &= np.isin(np.arange(start, start + n), senders)
        return sent, sent & (draws[1] >= options["dropout_after"])

    @staticmethod
    def _drops(config) -> bool:
        """Whether any round can lose a share: the model's own drop-outs or the federation model's."""
        options = config.trust_options
        return bool(options["dropout"] or options["dropout_after"] or not federation_of(config).ideal)

    @staticmethod
    def _senders(config, r: int) -> np.ndarray:
        return SecAggTrust._flags(config, r)[0]

    def _worst_round(self, config) -> tuple[float, int]:
        """min over rounds of senders / calibrated users (capped at 1), and the first round where it is."""
        worst, where = 1.0, 0
        if not (config.trust_options["dropout"] or not federation_of(config).ideal):
            return worst, where        # every user sends: min_survivors <= 1 of them carry the noise
        mins = config.trust_options["min_survivors"]
        for r in range(config.rounds):
            n = self._round_size(config, r)
            ratio = float(self._senders(config, r).sum()) / max(1, math.ceil(mins * n - 1e-9))
            if ratio < worst:
                worst, where = ratio, r
        return worst, where

    def _graph(self, plan, config, r: int):
        start = r * config.round_size
        users = np.arange(start, start + self._round_size(config, r), dtype=np.int64)
        k = plan.neighbours or None
        if k is None and self._drops(config):
            # the federation model's drop-outs of the round (seeded, so known here) add to the model's own rates
            away = 0.0 if federation_of(config).ideal else 1.0 - float(np.isin(users, round_senders(
                federation_of(config), r, start, start + len(users), config.populations)).mean())
            k = secagg.neighbours_for_dropout(len(users), min(0.9, config.trust_options["dropout"]
                                                              + config.trust_options["dropout_after"] + away))
        return secagg.ring_graph(plan.key, r, users, k)

    def _check_rounds(self, config, plan) -> None:
        """Refuse a run one of whose rounds would abort (a needed secret with fewer responding holders than the
        threshold): the drop-outs are seeded, so it is known before the run."""
        if not self._drops(config):
            return
        for r in range(config.rounds):
            sent, responded = self._flags(config, r)
            graph = self._graph(plan, config, r)
            probe = np.zeros(1, dtype=np.uint64)
            try:
                secagg.unmask(probe, sent, responded, graph, plan.key, r, plan.bits, offset=0)
            except secagg.ReconstructionFailed as error:
                raise ConfigError("trust_options.neighbours", config.trust_options["neighbours"],
                                  f"round {r} would abort: {error}; give more neighbours") from None

    # ---- the users' side -------------------------------------------------------------------------------------------
    def _scales(self, algo, start: int, stop: int) -> np.ndarray:
        """Each sent entry's scale in round [start, stop): the field's, over the round's largest public weight
        (so one user's quantized contribution has the same sensitivity in every round)."""
        plan, sent, layout = algo.secagg, algo.sum_layout(), algo.layout()
        weights = _weight_max(algo, start, stop, layout.width)
        scales = np.ones(sent.width)
        for name, f in plan.fields.items():
            w = 1.0
            if f.source is not None and algo.weighs():
                w = float(np.max(np.abs(weights[layout.slices[f.source]]))) or 1.0
            scales[sent.slices[name]] = f.scale / w
        return scales

    @staticmethod
    def _entries(shape, symmetric: bool) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(independent, gather) for a field of `shape`: the flat indices of its independent entries (a symmetric
        field's upper triangles) and, per flat entry, the position of its independent entry; (None, None) when
        every entry is independent."""
        if not symmetric:
            return None, None
        d = shape[-1]
        lead = int(np.prod(shape[:-2], dtype=np.int64))
        i, j = np.triu_indices(d)
        independent = (np.arange(lead)[:, None] * d * d + i * d + j).reshape(-1)
        position = np.empty(lead * d * d, dtype=np.int64)
        k = np.arange(lead)[:, None] * len(i) + np.arange(len(i))
        for a, b in ((i, j), (j, i)):       # entry (a, b) and its mirror (b, a) read the same independent entry
            position[(np.arange(lead)[:, None] * d * d + a * d + b).reshape(-1)] = k.reshape(-1)
        return independent, position

    def seal(self, algo, rows, users, rng):
        """Weigh or fold, scale, round at random, add the Skellam shares, mask: what leaves each user (as float64
        residues of Z_m, exact integers). A symmetric field is rounded and noised on its upper triangle, mirrored."""
        config, plan = algo.config, algo.secagg
        B = config.round_size
        r = int(users[0]) // B
        start, stop = r * B, min(r * B + B, config.users)
        x = algo.client_sums(rows, users)
        x *= self._scales(algo, start, stop)
        n_cal = self._calibrated(plan, stop - start)
        sent = algo.sum_layout()
        q = np.empty(x.shape, dtype=np.int64)
        for name, f in plan.fields.items():
            part = sent.slices[name]
            independent, gather = self._entries(sent.shapes[name], f.symmetric)
            block = x[:, part] if independent is None else x[:, part][:, independent]
            values = secagg.randomized_round(block, rng.random(block.shape))
            if f.source is not None:
                values += secagg.skellam_shares(rng, len(users), block.shape[1], f.variance / n_cal)
            q[:, part] = values if gather is None else values[:, gather]
        senders, _ = self._flags(config, r)
        local = np.asarray(users, dtype=np.int64) - start
        out = np.zeros(q.shape, dtype=np.float64)          # a user who drops before sending sends nothing
        sending = senders[local]
        if sending.any():
            graph = self._graph(plan, config, r)
            masked = secagg.mask(q[sending], local[sending], graph, plan.key, r, plan.bits)
            out[sending] = masked.astype(np.float64)
        return out

    # ---- the server's side -----------------------------------------------------------------------------------------
    def server_noise(self, algo, sums, start, stop, rng):
        return None            # the noise is already in the sum

    def decode(self, algo, joined, start, stop):
        """Unmask the round's sum (the self masks of its senders, the pair masks of its drop-outs), read it as signed
        integers, divide by the scale."""
        config, plan = algo.config, algo.secagg
        r = int(start) // config.round_size
        sent, responded = self._flags(config, r)
        total = np.asarray(np.round(joined), dtype=np.float64)
        if np.any(total < 0) or np.any(total >= 2.0 ** FLOAT_BITS):
            raise ValueError("secagg: a round's sum of residues out of range")
        residues = secagg.mod(total.astype(np.uint64), plan.bits)
        unmasked = secagg.unmask(residues, sent, responded, self._graph(plan, config, r), plan.key, r, plan.bits)
        signed = secagg.to_signed(unmasked, plan.bits).astype(np.float64)
        return signed / self._scales(algo, int(start), int(stop))

    def sent_fields(self, algo) -> dict:
        """Each user sends its share of the aggregate (weighed or folded by itself), masked."""
        return dict(algo.sum_layout().shapes)

    def field_domain(self, algo, key, declared):
        """One masked vector's entries: residues of Z_m, all a shard can check."""
        m = 2.0 ** algo.secagg.bits
        return Domain(algo.sum_layout().shapes[key], low=0.0, high=m - 1.0, integral=True,
                      source=f"secure aggregation: a masked residue of Z_(2**{algo.secagg.bits})")

    def noise(self, algo) -> dict:
        """Each private field's noise in a round's sum, in the data's units: the Skellam noise the shares give
        (calibrated for min_survivors of the users) plus the rounding's variance (at most 1/4 per user), on every
        entry."""
        if getattr(algo, "secagg", None) is None:
            raise RuntimeError(f"{algo.name}: field_noise() is known once the trust model has built the algorithm; "
                               f"read it in initial_state() or update(), not in setup() or consts()")
        found = {}
        for f in algo.secagg.fields.values():
            if f.source is not None:
                found[f.source] = FieldNoise("skellam", (f.variance + algo.config.round_size / 4.0) / f.scale ** 2,
                                             "shares", "all")
        return found

    # ---- accounting ------------------------------------------------------------------------------------------------
    def noise_makers(self, algo) -> dict:
        """Per private field, its release: the Skellam noise really in a round's sum at the worst round."""
        plan = algo.secagg
        made = {}
        for f in plan.fields.values():
            if f.source is None:
                continue
            eps, delta = plan.realized.get(f.source, (f.eps, f.delta))
            eps = max(eps, f.eps) if plan.worst_ratio < 1.0 else f.eps
            made[f.source] = SkellamRelease(Guarantee("skellam", "central", float(eps), float(delta), float(f.l2),
                                                      "l2"), f.variance * min(plan.worst_ratio, 1.0), f.l2, f.l1)
        return made

    def label_rows(self, algo, rows):
        scope = ("secure aggregation: the user's quantized data and its share of Skellam noise reach the server only "
                 "in the round's masked sum; the noise really in that sum at the run's worst round, for one user's "
                 "quantized contribution (parallel composition over the rounds)")
        return [{**row, "trust": self.name, "scope": scope} for row in rows]

    def summary(self, config, algo) -> dict:
        plan = algo.secagg
        composed = accounting.compose(algo.ledger(), config.delta)
        below = plan.worst_ratio < 1.0
        if not below:
            accounting.check_budget(composed, config.eps, config.delta, config.algorithm)
        return {**composed.summary(), **self.summary_labels(config), "privacy_secagg_bits": plan.bits,
                "privacy_secagg_wrap_bound": plan.wrap_bound, "privacy_secagg_worst_round": plan.worst_round,
                "privacy_secagg_noise_ratio": min(plan.worst_ratio, 1.0), "privacy_secagg_below_target": below}

    def describe(self, s: dict, config) -> str:
        short = (f"; round {s['privacy_secagg_worst_round']} had fewer senders than calibrated: its noise is "
                 f"{s['privacy_secagg_noise_ratio']:.3g} of the target's" if s["privacy_secagg_below_target"] else "")
        return (f"privacy (secagg): quantized data and Skellam noise shares, masked in Z_2^{s['privacy_secagg_bits']} "
                f"(wrap-around at most {s['privacy_secagg_wrap_bound']:.2g}); each user's guarantee (eps, delta) = "
                f"({s['privacy_eps_composed']:.6g}, {s['privacy_delta_composed']:.3g}){short}")
