"""An algorithm in two halves.

Client half (runs inside a population, vectorized over the users of a round): `act` chooses the arms from the
published model, `encode` builds each user's message and privatizes it with the algorithm's local randomizer.
Server half: `initial_state`, `update` (fold one round's aggregated messages into the state) and `publish`
(the model the next round's users see). `aggregate` sums messages; it is post-processing of privatized values,
so it may run in a population (pre-aggregated mode) or in a server shard (per-user mode) with the same result.

Messages are dicts of arrays whose leading axis is the user. Under local DP every field that is not listed in
`public_fields` must be the output of a mechanism: nothing raw leaves the client half.

Options: an algorithm declares them once, `options = {"alpha": Option(0.1, low=0, high=1, ..., doc="...")}`
(ldpfed.algorithms.options); `defaults` is derived from them, and `__init__` validates every option of a run in
one place before `setup()`, so `self.params` holds validated values (floats as float, ints as int). A class that
lists plain `defaults` instead still works: its options are then accepted as they are (or keep the checks of an
inherited option of the same name). `option_table()` describes them (name, default, kind, bounds, doc).
"""
from __future__ import annotations

import numpy as np

from ldpfed.util.options import declare_options, option_rows, refuse_unknown
from ldpfed.mechanisms.accounting import noise_fields
from ldpfed.mechanisms.noise import local_noise
from ldpfed.mechanisms.protocol import DataBoundRequired
from ldpfed.util.errors import ConfigError

ONE_MESSAGE = "one output per user: each user arrives once and sends this field once"
ONE_RELEASE = ("one mechanism per run: every release of the run is covered by this one guarantee (a user is in "
               "one element of the stream)")


class Algorithm:
    """The contract every algorithm keeps, built-in or plugin (the module doc has the two halves).

    Class attributes a subclass sets: `name` (the registry name, e.g. "my-algo"), `paper` (where it comes from),
    `privacy_model` ("ldp", "central" or "none"), `env_kinds` (the kinds of world it runs on: it runs on every env
    of one of these kinds, `runs_on`; a kind is an env's name, and an env declares the other kinds it is, Env.kinds)
    and `default_env` (an env it runs on),
    `options` ({name: Option}: default, kind, bounds, doc; `defaults` is derived from it), `public_fields` (message
    fields the protocol makes public, e.g. a scheduled arm), `public_draws` (public fields each user draws with its
    own coins from the round's published distribution), `profile_defaults` (defaults that differ under the
    "authors-code" profile) and `paper_setting` (the paper's experiment, as RunConfig fields).

    Set on each instance before `setup()`: `world` (the PublicWorld: sizes and public bounds, never the env),
    `config` (the RunConfig), `params` (the validated options), `eps`, `delta`, `d`, `K`, `multi`, `mechanisms`
    ({field: mechanism}, filled by `setup()`); after building, `trust` (the run's TrustModel) and, where they apply,
    `shuffle` (its ShufflePlan) and `central` (the central model's twins of the mechanisms)."""

    name: str = ""
    paper: str = ""                  # which seed and algorithm of it
    privacy_model: str = "none"      # "ldp", "central" or "none"
    env_kinds: tuple = ()            # kinds of world (env names) it runs on: every env of these kinds (runs_on)
    default_env: str = ""            # its paper's setting
    options: dict = {}               # option name -> Option: default (the paper's value), kind, bounds, doc
    defaults: dict = {}              # option name -> default, derived from `options` (see __init_subclass__)
    public_fields: frozenset = frozenset()  # message fields that the protocol makes public (e.g. a public arm)
    # a message folded rounds after it was made (a federation model's late messages) means what it meant when made:
    # False when the update reads the round's sums through the model published for that round (importance weights)
    late_messages: bool = True
    # Public fields each user draws with its own coins from the round's published distribution, the same for every
    # user of the round (a Thompson or Tsallis arm): part of one randomizer, so they split no shuffled batch.
    public_draws: frozenset = frozenset()
    _fields: dict | None = None      # what fields() declared (set after setup()); None: the methods are written
    # The paper's experiment, for jobs/: RunConfig fields, e.g. {"env_params": {...}, "users": 10**5, "eps": 1.0,
    # "delta": 0.01, "params": {...}}; the env is `default_env`.
    trust = None                     # the run's TrustModel (ldpfed.trust), set when it is built; None: local
    shuffle = None                   # the shuffle trust model's ShufflePlan (ldpfed.trust.shuffle)
    central = None                   # the central trust model's twins: {field: its mechanism's CentralTwin}
    paper_setting: dict = {}
    # Options whose default differs under RunConfig.profile="authors-code" (the public code's choices), e.g.
    # {"authors-code": {"step": 5.0}}; every key must be in `defaults`. No entry: identical under both profiles.
    profile_defaults: dict = {}

    def __init_subclass__(cls, **kwargs):
        """`defaults` from the class's own `options` (each Option's default must pass its own check); for a class
        that lists plain `defaults`, options built from them (ldpfed.algorithms.options.options_from_defaults)."""
        super().__init_subclass__(**kwargs)
        declare_options(cls, "params")

    def __init__(self, world, config):
        """world: the env's PublicWorld (ldpfed.envs.base), never the env itself: an algorithm sees only what its
        paper assumes public, no ground truth (tests/test_public_world.py walks every algorithm to check)."""
        self.world = world
        self.config = config
        self.profile = config.profile
        self.params = self.checked_params(config.params, self.profile)
        self.eps, self.delta, self.T = float(config.eps), float(config.delta), int(config.users)
        self.d, self.K = world.d, world.K
        self.mechanisms: dict = {}   # message field (or release) -> mechanism; the ledger is built from these
        self.setup()
        self._fields = self.fields()
        if self._fields is not None:     # the one declaration: mechanisms and public fields follow from it
            self.mechanisms.update({k: f.mechanism for k, f in self._fields.items() if f.mechanism is not None})
            self.public_fields = frozenset(k for k, f in self._fields.items() if f.public)

    def setup(self) -> None:
        """Build the mechanisms (self.params is validated already; what depends on other options or on the world,
        e.g. a value resolved from the env, is checked here)."""

    @classmethod
    def checked_params(cls, params: dict, profile: str) -> dict:
        """A run's options over the defaults (its profile's first), each checked: ConfigError naming params.<name>
        for an unknown or bad one. RunConfig calls it too, so a bad option stops a run before any work."""
        refuse_unknown(params, cls.defaults, "params", f"of {cls.name}")
        return cls.validate_params({**cls.defaults, **cls.profile_defaults.get(profile, {}), **params})

    @classmethod
    def validate_params(cls, params: dict) -> dict:
        """Every option's value through its Option's check (ConfigError naming params.<name>); the values of names
        without an Option are kept as they are."""
        options = cls.options
        return {name: (options[name].validate(name, value) if name in options else value)
                for name, value in params.items()}

    @classmethod
    def option_table(cls) -> list[dict]:
        """One row per option: name, default, kind, bounds (text: "(0, 1)", "[0, inf)", "one of [...]"), choices,
        allow (values accepted as they are, e.g. "auto"), accepts (what a value must be), doc, and the profiles
        whose default differs (profiles: {"authors-code": value})."""
        return option_rows(cls.options, cls.profile_defaults)

    # ---- server half -------------------------------------------------------------------------
    def initial_state(self, rng: np.random.Generator):
        raise NotImplementedError

    def publish(self, state):
        """The model every user of the next round sees (must not contain raw user data)."""
        return state

    def update(self, state, sums: dict, start: int, stop: int, rng: np.random.Generator):
        """Fold the aggregated messages of users [start, stop) into the state; return the new state."""
        raise NotImplementedError

    def estimate(self, state):
        """The parameter estimate compared with the env's truth, or None."""
        return None

    def round_size_caveat(self) -> str | None:
        """Called after setup(): what this run's round size does to the algorithm, in one sentence that reads after
        the algorithm's name, when it stops doing what its paper's algorithm does (e.g. rounds longer than a sliding
        window); None (the default): nothing to say. It goes into the run's summary (`round_size_caveat`) and the
        sweep report's notes beside the algorithm's rows."""
        return None

    # ---- client half -------------------------------------------------------------------------
    def act(self, model, contexts, users: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def encode(self, model, contexts, actions, rewards, users: np.ndarray, rng: np.random.Generator):
        """(messages, metrics): privatized per-user messages, and simulation counters (e.g. clipped users)
        that go to the metrics channel, never to the server."""
        raise NotImplementedError

    def fields(self) -> dict | None:
        """The message declared once: field -> ldpfed.algorithms.fields.Field (shape, the mechanism that makes it
        or the public domain, the data bound, per_user). Called after setup(); message_spec, message_domains,
        public_fields, mechanisms and the ledger rows then follow from it. None (the default): the algorithm
        writes those itself."""
        return None

    def message_spec(self) -> dict:
        """Per-user shape of every message field, e.g. {"M": (d, d), "u": (d,)}: the same for every user whatever
        their data (so a message's shape reveals nothing); server shards reject messages that do not match."""
        sent = self.sent_fields()
        if sent is not None:              # the trust model's: the users send their share of the aggregate
            return dict(sent)
        if self._fields is None:
            raise NotImplementedError(f"{self.name}: declare fields() or write message_spec()")
        return {key: f.shape for key, f in self._fields.items()}

    def aggregate(self, messages: dict, users: np.ndarray) -> dict:
        """Sum of the users' messages; override for per-user weights (e.g. SGD step sizes), which are public."""
        return {key: value.sum(axis=0) for key, value in messages.items()}

    # ---- what the server accepts: it trusts no client (ldpfed.mechanisms.domains) ------------------
    def message_domains(self) -> dict:
        """Per message field, the Domain every honest client's values lie in: the output domain of the mechanism
        that made the field, or the public schedule/bounds for the fields no mechanism made. Default: the
        mechanisms whose output domain needs no public input bound (l2-ball, randomized response: their
        output_domain(shape) works without data_bound); algorithms declare every other field."""
        sent = self.sent_fields()
        if sent is not None:              # the trust model's: all a shard can check of its messages
            return {key: self.trust.field_domain(self, key, None) for key in sent}
        if self._fields is not None:
            domains = {}
            for key, declared in self._fields.items():
                # the trust model's domain where users send something else than the mechanism's output
                own = None if self.trust is None else self.trust.field_domain(self, key, declared)
                try:
                    domains[key] = declared.make_domain() if own is None else own
                except NotImplementedError as error:
                    raise NotImplementedError(f"{self.name}: message field {key!r} declares no domain ({error})") \
                        from None
            return domains
        domains = {}
        for field, shape in self.message_spec().items():
            mech = self.mechanisms.get(field)
            if not callable(getattr(mech, "output_domain", None)):
                why = "no mechanism makes it" if mech is None else "its mechanism has no output_domain"
                raise NotImplementedError(f"{self.name}: message field {field!r} declares no domain ({why})")
            try:
                domains[field] = mech.output_domain(shape)
            except DataBoundRequired as error:
                raise NotImplementedError(f"{self.name}: message field {field!r} declares no domain ({error.reason}"
                                          f"; declare it in message_domains)") from None
        return domains

    def aggregate_bounds(self, users: np.ndarray) -> dict:
        """Per aggregated field, the SumBounds of what these honest users' `aggregate` can be. Default (plain
        sums): each field's domain summed over the users; algorithms with a weighted `aggregate` override."""
        if type(self).aggregate is not Algorithm.aggregate:
            raise NotImplementedError(f"{self.name}: aggregate is not a plain sum; declare aggregate_bounds")
        return {field: domain.sum_bounds(users) for field, domain in self.cached_domains().items()}

    def sent_fields(self) -> dict | None:
        """{field: per-user shape} when the trust model has the users send something else than the message
        (their share of the aggregate: TrustModel.sent_fields), else None."""
        return None if self.trust is None else self.trust.sent_fields(self)

    def sum_bounds(self, users: np.ndarray) -> dict:
        """What a shard checks a pre-aggregated payload of `users` against: aggregate_bounds, or the sent fields'
        domains summed when the users send their shares of the aggregate."""
        if self.sent_fields() is not None:
            return {field: domain.sum_bounds(users) for field, domain in self.cached_domains().items()}
        return self.aggregate_bounds(users)

    def trust_model(self):
        """The run's trust model (ldpfed.trust): the one that built this algorithm, else local's."""
        if self.trust is None:
            from ldpfed.trust.local import LocalTrust

            return LocalTrust()
        return self.trust

    def cached_domains(self) -> dict:
        """message_domains(), built once (a server shard checks every message against them)."""
        if "_domains" not in self.__dict__:
            self._domains = self.message_domains()
        return self._domains

    def field_noise(self) -> dict:
        """{message field: FieldNoise (kind, variance per entry, added per "user" or once per "round")}: the noise
        the server's aggregate carries under the run's trust model. A server half that corrects for noise reads
        it here, not off its own mechanisms: under "central" the server adds its twins' noise once to a round's
        sum instead of theirs; under "shuffle" the mechanisms already run at eps0 (self.eps when setup() ran).
        Known once the trust model has built the algorithm: read it in initial_state(), update() or between(),
        not in setup() (no field declared yet: {}) or consts() (under "central": RuntimeError)."""
        return local_noise(self.mechanisms) if self.trust is None else self.trust.noise(self)

    # ---- what the server can tell apart: the shuffle trust model hides a user only among the same randomizer ------
    def randomizer_groups(self, users: np.ndarray) -> np.ndarray | None:
        """One int64 label per user of `users` (arrival indices of one round): users with equal labels run the same
        local randomizer in that round whatever model the server published, so a shuffled server cannot tell them
        apart; users with different labels it can (a public field the schedule fixes, which slots a message fills).
        None: every user of the round runs the same randomizer. A label may split a set of users that the server
        cannot tell apart (finer is safe), never join users it can.

        Default: derived from the message's domains, the public schedule the server checks (each domain's
        `schedule_signature`): an `exact` value (a public count), a `scheduled` arm (user t < K pulls t), the sent
        `slots`. A public field whose domain fixes neither, and that is not in `public_draws`, leaves
        the groups unknown: NotImplementedError, which the shuffle trust model turns into a refusal (an algorithm
        then writes this method)."""
        users = np.asarray(users, dtype=np.int64)
        columns = []
        for key, domain in self.cached_domains().items():
            rows = domain.schedule_signature(users, any_model=True)
            if rows.shape[1]:
                columns.append(rows)
            elif key in self.public_fields and key not in self.public_draws:
                raise NotImplementedError(
                    f"{self.name}: public field {key!r} is neither fixed by a public schedule (its domain has no "
                    f"exact value or scheduled arm) nor drawn from the round's common distribution (public_draws): "
                    f"write randomizer_groups to say which users the server can tell apart")
        if not columns or not len(users):
            return None
        rows = np.concatenate(columns, axis=1)
        if (rows == rows[0]).all():
            return None
        return np.unique(rows, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)

    # ---- description -------------------------------------------------------------------------
    def ledger(self) -> list[dict]:
        """What the mechanisms of this run guarantee, one row per message field or release, with the noise they
        draw and how many of their outputs one user's data can change (`per_user`, and why: `composition`), which
        the privacy accountant (ldpfed.mechanisms.accounting) composes. Override to change `per_user`."""
        reason = (ONE_MESSAGE if self.privacy_model == "ldp" else ONE_RELEASE)
        declared = self._fields or {}
        # the trust model says whose noise the rows state (the mechanisms', the central twins', ...) and labels them
        made_by = self.mechanisms if self.trust is None else self.trust.noise_makers(self)
        rows = [{"message": key, **mech.guarantee.as_dict(), **noise_fields(mech),
                 "per_user": declared[key].per_user if key in declared else 1,
                 "composition": (declared[key].composition if key in declared else None) or reason}
                for key, mech in made_by.items()]
        return rows if self.trust is None else self.trust.label_rows(self, rows)

    @classmethod
    def runs_on(cls, env) -> bool:
        """Whether it runs on `env` (a registered env's name, or an Env subclass): the env is of one of its kinds."""
        if isinstance(env, str):
            from ldpfed.envs import ENVS

            if env not in ENVS:
                return False
            env = ENVS[env]
        return not set(cls.env_kinds).isdisjoint(env.kinds_of())

    @classmethod
    def envs(cls) -> list[str]:
        """The registered envs it runs on: its default env first, then those named in env_kinds in that order, then
        the other envs of those kinds (plugins) as ENVS lists them."""
        from ldpfed.envs import ENVS

        named = [cls.default_env] + [kind for kind in cls.env_kinds if kind in ENVS]
        found = [name for name in named if cls.runs_on(name)]
        found += [name for name, env in ENVS.items() if name not in found and cls.runs_on(env)]
        return list(dict.fromkeys(found))

    @classmethod
    def describe(cls) -> dict:
        return {"algorithm": cls.name, "paper": cls.paper, "privacy_model": cls.privacy_model,
                "envs": cls.envs(), "env_kinds": list(cls.env_kinds), "default_env": cls.default_env}
