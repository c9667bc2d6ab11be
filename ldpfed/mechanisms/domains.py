"""Output domains: the set of values an honest client's message field can take, as a contract the server checks.

A server that trusts no client rejects any message that no honest client could have sent. Each mechanism states
the domain of its outputs (`output_domain`): the l2-ball mechanism the sphere of radius B, randomized response
{0, 1}, the Gaussian and Laplace mechanisms the finite reals, narrowed to a tail bound that an honest client
exceeds with probability below TAIL_PROB per message field. A message field that no mechanism made (a public
arm, a public count, a unit direction) is declared by the algorithm from the public schedule.

`Domain` is the per-user contract; `Domain.reason(values, users)` checks a batch of users' values (vectorized)
and returns None or why the batch is out of the domain. `SumBounds` is what n honest users' aggregate can be
(pre-aggregated mode), built by `Domain.sum_bounds(users)` for plain sums or by the algorithm for weighted ones;
`SumBounds.reason(flat, lo, hi)` checks a flat segment [lo, hi) of the aggregated field.

Tail bounds (Gaussian): one noisy coordinate exceeds data_bound + z sigma with probability 2 Phi(-z); a field
of m noisy coordinates, by the union bound over its coordinates, with probability <= 2 m Phi(-z). z is chosen so
that this is FIELD_TAIL_PROB = 1e-13, and a message has at most 3 noisy fields (ldp-gloc), so an honest message is
rejected with probability < 1e-12. A sum of c users' values has noise N(0, c sigma^2) per coordinate and data
part at most c data_bound, so the same z bounds it: |sum| <= c data_bound + z sigma sqrt(c).
(Laplace: one coordinate exceeds data_bound + t with probability exp(-t/b); t = b ln(m / FIELD_TAIL_PROB).)
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import special

TAIL_PROB = 1e-12             # per honest message: the chance that the server rejects it
FIELD_TAIL_PROB = 1e-13       # per noisy field (at most 3 noisy fields per message -> < TAIL_PROB)
SPHERE_RTOL = 1e-9            # rounding of B * (unit vector) and of x / ||x||


def gaussian_tail_z(coords: int, prob: float = FIELD_TAIL_PROB) -> float:
    """z with 2 coords Phi(-z) = prob: no coordinate of `coords` i.i.d. N(0, 1) draws exceeds z in absolute value,
    except with probability prob (union bound over the coordinates)."""
    return float(-special.ndtri(prob / (2.0 * max(int(coords), 1))))


def laplace_tail(b: float, coords: int, prob: float = FIELD_TAIL_PROB) -> float:
    """t with coords exp(-t/b) = prob: no coordinate of `coords` i.i.d. Lap(b) draws exceeds t in absolute value,
    except with probability prob."""
    return float(b * math.log(max(int(coords), 1) / prob))


def _flat(value, shape) -> np.ndarray:
    return np.broadcast_to(np.asarray(value, dtype=np.float64), shape).reshape(-1)


class Domain:
    """The values one user's message field (per-user shape `shape`) can take.

    low, high: element-wise bounds of the data part (scalars or arrays broadcast to `shape`); `noise` widens them:
      ("gaussian", sigma, z): by z sigma per user, z sigma sqrt(c) for a sum of c users;
      ("laplace", t): by t per user, c t for a sum (union bound over the users).
    slots(users) -> (n, shape[0]) 0/1: which slots of the leading axis carry a message (public schedule); the
      others must be exactly 0 and the bounds apply to the sent ones.
    exact(users) -> (n, *shape): the only value an honest user sends (a public count).
    integral: entries are whole numbers. radius: every row (last axis) of a sent slot has l2 norm `radius`
      (the l2-ball sphere; unit directions). max_radius: row norms at most this. norm_part: the radius applies to
      the first norm_part entries of each row only (e.g. the context x of z = [x; r]). symmetric: the last two axes
      form a symmetric matrix. one_hot: every row is 0/1 with exactly one 1; at_most_one: with at most one 1.
    scheduled: K: an arm (a scalar arm, or a one-hot row) on the public schedule "user t < K pulls arm t, the
      others of a round pull the round's one published arm"; published: model -> that arm, from the model the
      server published for the round. A check given the round's model (`model=`) checks the arm itself; without
      it, only that the users of a message agree on one arm (a server shard never folds such a message without
      the model: it rejects it, "no published schedule").
    source: what the contract comes from (for the ledger and error messages).
    """

    def __init__(self, shape, *, low=-np.inf, high=np.inf, noise=None, slots=None, exact=None, integral=False,
                 radius=None, max_radius=None, norm_part=None, symmetric=False, one_hot=False, at_most_one=False, scheduled=None,
                 published=None, source=""):
        self.shape = tuple(int(s) for s in shape)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.data_low, self.data_high = _flat(low, self.shape), _flat(high, self.shape)
        self.noise = noise
        widen = self._widen(1.0)
        self.low, self.high = self.data_low - widen, self.data_high + widen
        self.slots, self.exact, self.integral = slots, exact, bool(integral)
        self.radius, self.max_radius = radius, max_radius
        self.symmetric, self.one_hot, self.at_most_one = bool(symmetric), bool(one_hot), bool(at_most_one)
        self.scheduled, self.published = scheduled, published
        self.source = source
        self.row = self.shape[-1] if self.shape else 1
        self.norm_part = self.row if norm_part is None else int(norm_part)
        self.bounded = bool(np.isfinite(self.low).all() and np.isfinite(self.high).all())
        if not (self.bounded or exact is not None):
            raise ValueError(f"a domain must be bounded or exact ({source})")
        self.uniform = bool(self.size and (self.low == self.low[0]).all() and (self.high == self.high[0]).all())
        self._sum_cache: dict = {}     # n -> SumBounds, when they depend on the number of users only

    def _widen(self, count):
        """How far noise moves a sum of `count` users beyond its data part (0 without noise)."""
        if self.noise is None:
            return 0.0
        if self.noise[0] == "gaussian":
            _, sigma, z = self.noise
            return z * sigma * np.sqrt(count)
        return self.noise[1] * count

    def __repr__(self):
        return f"Domain({self.shape}, {self.source})"

    # ---- one user at a time (vectorized over the users of a message) ---------------------------------------
    def reason(self, values: np.ndarray, users: np.ndarray, lo: int | None = None, hi: int | None = None,
               model=None):
        """None if every user's value lies in the domain, else the reason. values: (n, *shape), or the columns
        [lo, hi) of the flattened per-user values, shape (n, hi - lo) (block layout: only the element-wise and
        row-norm-at-most checks apply to a slice). A value that is not finite is never in the domain (every
        domain is bounded or exact, and every comparison is written so that nan fails it). `symmetric` is checked
        on the aggregate (`symmetric_reason`), not here: see there."""
        n = values.shape[0]
        whole = lo is None
        flat = values.reshape(n, -1)
        cols = slice(None) if whole else slice(lo, hi)
        if self.exact is not None:
            want = np.asarray(self.exact(users), dtype=np.float64).reshape(n, -1)[:, cols]
            return None if np.array_equal(flat, want) else "not the public schedule"
        sent = None
        if self.slots is not None:
            per_slot = self.size // self.shape[0]
            sent = np.repeat(np.asarray(self.slots(users), dtype=bool), per_slot, axis=1)[:, cols]
            if np.any(flat[~sent] != 0.0):
                return "a slot the schedule leaves empty is not empty"
        if self.bounded and not (self.radius is not None and sent is None):   # (the sphere implies its bounds)
            if sent is None and self.uniform:   # one bound for every element: two reductions, no temporaries
                if flat.size and not (np.maximum.reduce(flat, axis=None) <= self.high[0]
                                      and np.minimum.reduce(flat, axis=None) >= self.low[0]):   # nan: out
                    return "outside the bounds"
            else:
                low, high = self.low[cols], self.high[cols]
                inside = (flat >= low) & (flat <= high)
                if not (inside.all() if sent is None else (inside | ~sent).all()):
                    return "outside the bounds"
        if self.integral and not np.array_equal(flat, np.round(flat)):
            return "not whole numbers"
        if self.radius is not None or self.max_radius is not None:
            if whole:
                rows = values.reshape(n, -1, self.row)[..., :self.norm_part]
                squares = np.einsum("nkd,nkd->nk", rows, rows)       # squared norms: no square root needed
                if self.radius is not None:
                    lo, hi = (self.radius * (1 - SPHERE_RTOL)) ** 2, (self.radius * (1 + SPHERE_RTOL)) ** 2
                    ok = (squares >= lo) & (squares <= hi)          # (False for nan)
                    if sent is not None:
                        ok |= ~np.asarray(self.slots(users), dtype=bool)
                    if not ok.all():
                        return "not on the sphere"
                elif not (squares <= (self.max_radius * (1 + SPHERE_RTOL)) ** 2).all():
                    return "norm too large"
            else:   # a slice of a row has at most the row's norm
                bound = self.radius if self.radius is not None else self.max_radius
                part = flat[:, :max(0, min(hi, self.norm_part) - lo)]
                if self.row == self.size and np.einsum("nd,nd->n", part, part).max(initial=0.0) > (
                        bound * (1 + SPHERE_RTOL)) ** 2:
                    return "norm too large"
        if not whole:
            return None
        if self.one_hot or self.at_most_one:
            rows = flat.reshape(n, -1, self.row)
            if not ((rows == 0.0) | (rows == 1.0)).all():
                return "not 0/1"
            ones = rows.sum(axis=-1)
            if (self.one_hot and not (ones == 1.0).all()) or (ones > 1.0).any():
                return "not one-hot"
        if self.scheduled is not None:
            arms = self._arms(values)
            users = np.asarray(users)
            init = users < self.scheduled
            if not ((arms >= 0).all() and (arms < self.scheduled).all() and np.array_equal(arms[init], users[init])):
                return "not the scheduled arm"
            rest = arms[~init]
            if rest.size and not (rest == rest[0]).all():
                return "not the scheduled arm"
            if rest.size and model is not None and self.published is not None and rest[0] != self.published(model):
                return "not the published arm"
        return None

    # ---- shuffled messages: whose is which is unknown ----------------------------------------------------------
    def anonymous_reason(self, values: np.ndarray, batch: np.ndarray, model=None):
        """None if `values` (n, *shape), a shuffled chunk, could be the messages of n distinct honest users of
        `batch` (the users the shuffler mixed, public) in some order, else why not. Checked: what depends on no
        user as in `reason`; a public schedule (exact values, sent slots, scheduled arms) as a multiset: every
        message's schedule signature (its value, its non-empty slots, its arm) must be that of some user of the
        batch, no signature more often than the batch has it, and each message is checked in full as a user with
        that signature (a representative)."""
        n = values.shape[0]
        if self.exact is None and self.slots is None and self.scheduled is None:
            return self.reason(values, np.full(n, -1, dtype=np.int64), model=model)   # no user's index is read
        batch = np.asarray(batch, dtype=np.int64)
        theirs = self.schedule_signature(batch, model)
        ours = self._message_signature(values)
        if theirs is None:
            # a scheduled arm without the published model (a caller that holds none; the shards reject such a
            # message first, "no published schedule"): its range only, each message checked as the user whose
            # scheduled arm it names (an arm outside [0, K) names no such user and fails)
            arms = np.nan_to_num(ours[:, -1], nan=-1.0, posinf=-1.0, neginf=-1.0).astype(np.int64)
            return self.reason(values, arms, model=None)
        keys, first, counts = np.unique(theirs, axis=0, return_index=True, return_counts=True)
        found, inverse, used = np.unique(ours, axis=0, return_inverse=True, return_counts=True)
        inverse = inverse.reshape(-1)
        for j, signature in enumerate(found):
            match = np.flatnonzero((keys == signature).all(axis=1))
            if match.size == 0:
                return "not on the public schedule (no user of the batch has this schedule)"
            if used[j] > counts[match[0]]:
                return "not on the public schedule (more messages than users of the batch with this schedule)"
            group = inverse == j
            why = self.reason(values[group], np.full(int(used[j]), batch[first[match[0]]]), model=model)
            if why is not None:
                return why
        return None

    def schedule_signature(self, users: np.ndarray, model=None, any_model: bool = False):
        """(n, k) float rows: what the public schedule fixes of each user's message ((n, 0): nothing). A scheduled
        arm needs the round's published model (None without it), unless `any_model`: then the users past the
        schedule get one placeholder arm (-1), as they all pull the one arm a model publishes, whichever it is."""
        parts = []
        if self.exact is not None:
            parts.append(np.asarray(self.exact(users), dtype=np.float64).reshape(len(users), -1))
        if self.slots is not None:
            parts.append(np.asarray(self.slots(users), dtype=np.float64).reshape(len(users), -1))
        if self.scheduled is not None:
            if any_model:
                published = -1
            elif model is None or self.published is None:
                return None
            else:
                published = self.published(model)
            arm = np.where(users < self.scheduled, users, published)
            parts.append(arm.astype(np.float64)[:, None])
        return np.hstack(parts) if parts else np.empty((len(users), 0))

    def _arms(self, values: np.ndarray) -> np.ndarray:
        """The arm each message of a scheduled field names: its one-hot row's 1, or the scalar itself."""
        n = values.shape[0]
        return values.reshape(n, -1).argmax(axis=1) if self.one_hot else values.reshape(n)

    def _message_signature(self, values: np.ndarray) -> np.ndarray:
        """The same rows read off the messages: their values, their non-empty slots, their arms."""
        n = values.shape[0]
        parts = []
        if self.exact is not None:
            parts.append(np.asarray(values, dtype=np.float64).reshape(n, -1))
        if self.slots is not None:
            parts.append((values.reshape(n, self.shape[0], -1) != 0.0).any(axis=2).astype(np.float64))
        if self.scheduled is not None:
            parts.append(np.asarray(self._arms(values), dtype=np.float64)[:, None])
        return np.hstack(parts)

    # ---- a sum of users ------------------------------------------------------------------------------------
    def sum_bounds(self, users: np.ndarray) -> "SumBounds":
        """What the plain sum of these users' values can be."""
        n = len(users)
        if self.exact is None and self.slots is None and self.scheduled is None:
            cached = self._sum_cache.get(n)
            if cached is None:
                if len(self._sum_cache) > 64:
                    self._sum_cache.clear()
                cached = self._sum_cache[n] = self._sum_bounds(users)
            return cached
        return self._sum_bounds(users)

    def _sum_bounds(self, users: np.ndarray) -> "SumBounds":
        n = len(users)
        if self.exact is not None:
            exact = np.asarray(self.exact(users), dtype=np.float64).reshape(n, -1).sum(axis=0)
            return SumBounds(exact, exact, exact=exact)
        if self.slots is not None:
            count = np.repeat(np.asarray(self.slots(users), dtype=np.float64).sum(axis=0), self.size // self.shape[0])
        else:
            count = np.full(self.size, float(n))
        widen = self._widen(count)
        low, high = count * self.data_low - widen, count * self.data_high + widen
        groups = group_max = None
        bound = self.radius if self.radius is not None else self.max_radius
        if bound is not None:   # the sum of c vectors of norm <= bound has norm <= c bound (per slot row)
            groups, group_max = _row_groups(self.size, self.row, self.norm_part,
                                            count[::self.row] * bound * (1 + SPHERE_RTOL))
        total_max = total = None
        if self.one_hot:
            total = float(n) * (self.size // self.row)
        elif self.at_most_one:
            total_max = float(n) * (self.size // self.row)
        scheduled = None
        if self.scheduled is not None and self.one_hot:
            scheduled = _schedule_counts(users, self.scheduled)
        return SumBounds(low, high, integral=self.integral, groups=groups, group_max=group_max, total=total,
                         total_max=total_max, scheduled=scheduled, published=self.published,
                         symmetric=self.shape if self.symmetric else None)


def symmetric_reason(flat: np.ndarray, shape: tuple):
    """None if the flattened aggregate of a field of per-user shape (..., d, d) is symmetric in its last two axes.
    Symmetry is checked on aggregates (a population's sum; one small pass instead of a transposed copy of every
    user's matrix): the server folds only aggregates, which are sums of the users' matrices with public scalar
    weights, so a skew part that cancels within a message changes nothing the server computes, and a skew part
    that does not cancel is caught; the element-wise bounds still hold for every user."""
    total = flat.reshape(shape)
    return None if (total == np.swapaxes(total, -1, -2)).all() else "not symmetric"


def _row_groups(size: int, row: int, norm_part: int, row_max: np.ndarray):
    """Group ids of the flattened elements: the first norm_part entries of row j form group j (bounded by
    row_max[j]); the other entries of row j form group rows + j (unbounded)."""
    rows = size // row
    index = np.arange(size)
    groups = index // row + rows * (index % row >= norm_part)
    return groups, np.concatenate([np.asarray(row_max, dtype=np.float64), np.full(rows, np.inf)])


def _schedule_counts(users, K: int):
    """(counts of the users < K, which pull arm = user; how many others, which all pull one arm)."""
    users = np.asarray(users)
    init = users[users < K]
    return np.bincount(init, minlength=K).astype(np.float64), float(len(users) - len(init))


class SumBounds:
    """What the aggregate of one field over a population of honest users can be, element-wise on the flattened
    field (low, high: None when a group bound implies them; integral; exact), per group of elements (group_max
    bounds the l2 norm of each group, e.g. n B for a sum of n l2-ball outputs), and over the whole field (total:
    the sum of all elements; total_max; scheduled = (init_counts, n_rest): the counts of a scheduled arm,
    init_counts plus n_rest on one arm, the published one (published(model)) when the check is given the
    round's model; symmetric). Whole-field conditions are checked only when a shard holds
    the whole field. Every comparison is written so that nan fails it; an aggregate that passes is finite."""

    def __init__(self, low, high, *, size=None, integral=False, exact=None, groups=None, group_max=None, total=None,
                 total_max=None, scheduled=None, published=None, symmetric=None):
        self.low = None if low is None else np.asarray(low, dtype=np.float64)
        self.high = None if high is None else np.asarray(high, dtype=np.float64)
        self.size = int(size if size is not None else (self.low.size if self.low is not None else exact.size))
        self.integral, self.exact = integral, exact
        self.groups, self.group_max = groups, group_max      # (without low/high, finite group bounds)
        self.total, self.total_max, self.scheduled, self.published = total, total_max, scheduled, published
        self.symmetric = symmetric      # the per-user shape (..., d, d) of a symmetric field, or None

    def reason(self, flat: np.ndarray, lo: int = 0, hi: int | None = None, model=None):
        hi = self.size if hi is None else hi
        whole = lo == 0 and hi == self.size
        if self.exact is not None:
            return None if np.array_equal(flat, self.exact[lo:hi]) else "not the public schedule"
        if self.low is not None and not ((flat >= self.low[lo:hi]).all() and (flat <= self.high[lo:hi]).all()):
            return "sum outside what the population can send"
        if self.integral and not np.array_equal(flat, np.round(flat)):
            return "not whole numbers"
        if self.groups is not None:
            sq = np.bincount(self.groups[lo:hi], weights=flat * flat, minlength=self.group_max.size)
            if not (sq <= self.group_max ** 2).all():
                return "sum norm larger than the population can send"
        if whole:
            if self.symmetric is not None and symmetric_reason(flat, self.symmetric) is not None:
                return "not symmetric"
            s = float(flat.sum())
            if (self.total is not None and s != self.total) or (self.total_max is not None and s > self.total_max):
                return "sum total not the population's"
            if self.scheduled is not None:
                init, rest = self.scheduled
                extra = flat - init
                if (extra < 0).any() or extra.sum() != rest or np.count_nonzero(extra) > 1:
                    return "not the scheduled arm"
                if rest and model is not None and self.published is not None and \
                        extra[self.published(model)] != rest:
                    return "not the published arm"
        return None


@lru_cache(maxsize=64)
def _consecutive_groups(size: int, row: int) -> np.ndarray:
    groups = np.arange(size) // row
    groups.setflags(write=False)
    return groups


def weighted_sphere_bounds(weight_sums, radius: float, size: int, row: int) -> SumBounds:
    """Bounds of sum_i w_i Z_i, Z_i rows of norm `radius` (l2-ball outputs), given weight_sums = sum_i |w_i| per
    row of the field (a scalar or (size // row,)): each row of the sum has norm <= sum_i |w_i| radius (which
    bounds every element of it too)."""
    per_row = np.asarray(weight_sums, dtype=np.float64).reshape(-1) * (radius * (1 + SPHERE_RTOL))
    if per_row.size != size // row:
        per_row = np.full(size // row, per_row[0])
    return SumBounds(None, None, size=size, groups=_consecutive_groups(size, row), group_max=per_row)
