"""An algorithm written once: what one user does and what the server does, as compiled (numba) functions that
every path runs: the batched engine (a round of users), per-user mode, the Ray engine and the paper's sequential
path (ldpfed.engine.sequential: one user at a time, B = 1).

A `CompiledAlgorithm` declares its message as `fields()` (ldpfed.algorithms.fields), as every algorithm may, and
writes four functions in numba-compatible Python (`steps()` returns them as `Steps`):

* `act(model, consts, contexts, i, user, draws, actions)`: user i of the block (global index `user`) chooses;
  writes actions[i]. `model` is the
  tuple of the published arrays (`model_keys` of the state), `consts` the algorithm's constants (`consts()`),
  `contexts` the block's contexts ((n, 0) in context-free worlds), `draws` the block's (n, act_draws) uniforms.
* `prepare(model, consts, contexts, actions, reward, user, i, inputs, counts)`: user i's clipped data, written
  into row i of `inputs` field by field (the layout of `fields()`, in declaration order), and its metric counters
  into counts[i] (the order of `metric_names`). This is all the algorithm does with a user's data: each field's
  mechanism then privatizes its part of the row (ldpfed.mechanisms.rows), so under local DP nothing the algorithm
  writes leaves the user unprivatized. A public field's value passes as it is.
* `finish(consts, user, row)` (optional): post-processing of the user's privatized row before it is sent, e.g. a
  field's slots that the public schedule does not send zeroed, or a randomized-response report kept only in the
  pulled arm's slot (a public field of the same row). It sees the privatized row only, never the user's data.
* `weigh(consts, user, row)`: the public per-user weights of the aggregate, applied in place to the user's
  privatized row (`no_weights`: a plain sum).
* `fold(consts, user, row, out)` (optional, in place of `weigh`): adds the user's privatized row into `out`, the
  aggregate row, whose fields `sum_fields()` declares ({name: shape}) when the aggregate is not a (weighed) sum of
  the message rows, e.g. per-arm sums from a public arm index and one noisy value (post-processing of the
  privatized row with public data). The algorithm then declares `aggregate_bounds` for those fields.
* `update(state, consts, sums, start, stop, server)`: the server folds the aggregated rows of users [start, stop)
  into the state (a tuple of arrays, `state_keys`), in place. At B = 1 the sums are one user's row (with `fold`: the
  row folded into a zeroed aggregate row). `server`: the
  server's own random numbers for these users, (stop - start, q) from `draw_server` (e.g. a central model's noise;
  (n, 0) for most algorithms).

Two hooks for what does not fit a per-user compiled function (both optional):
* `draw_server(n, rng) -> (n, q)`: the server's random numbers for n users, drawn from the round's server Generator.
* `breaks(start, stop)` and `between(state, stop, rng)`: the users u in (start, stop] after whose update a step in
  plain Python runs (e.g. a LASSO solve at the end of an episode); the batched `update` runs `between` once after
  the compiled update when a break falls in its round, the sequential engine after the user.

The state is a dict of numpy arrays (scalars as arrays of shape (1,)), so it pickles, checkpoints and travels to
Ray actors as any algorithm's; the compiled functions see it as the tuple of its `state_keys` arrays.
Everything the functions need that is not data is in `consts` (built in Python from the validated options), so the
compiled functions are the same for every instance and numba caches them on disk.

The loops that call them (`round_loops` here, envs.base's step loop, the sequential engine's user loop) are built
per algorithm by ldpfed.util.jit, with the functions (and the compiled helpers they call) inlined, and compiled once per
machine (about a second each): ldpfed.util.jit writes them out as modules under its cache folder, keyed by a hash of
everything they inline, and numba caches those, so another process loads them; the fields' mechanisms are compiled
per message layout (ldpfed.mechanisms.rows.FieldLayout.row_privatizer).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from ldpfed.algorithms.base import Algorithm
from ldpfed.mechanisms.rows import FieldLayout
from ldpfed.util.jit import loops


class Steps(NamedTuple):
    """The compiled (numba @njit) functions of a CompiledAlgorithm, each about one user or one fold of the server:

    act(model, consts, contexts, i, user, draws, actions): user i of the block (global index `user`) writes its
      action into actions[i]; draws[i] holds its act_draws numbers from draw_act.
    prepare(model, consts, contexts, actions, reward, user, i, inputs, counts): user i's clipped data into its
      row inputs[i], field after field in the order of fields(); its counters into counts[i].
    weigh(consts, user, row): the public per-user weights, applied to the privatized row in place (no_weights:
      a plain sum).
    update(state, consts, sums, start, stop, server): folds the aggregate of users [start, stop) into the state
      arrays IN PLACE and returns nothing. state: the tuple of the state's arrays in state_keys order; sums: ONE
      flat float row, each field's per-user values summed over the users, flattened and laid end to end in the
      order of fields() (or of sum_fields() with a fold); server: draw_server(stop - start, rng), row i for user
      start + i.
    finish(consts, user, row) (optional): post-processing of the privatized row before it is sent.
    fold(consts, user, row, out) (optional, replaces weigh): adds the privatized row into `out`, an aggregate row
      laid out by sum_fields(), when the aggregate is not a (weighed) sum of the message rows."""

    act: object
    prepare: object
    weigh: object
    update: object
    finish: object = None      # None: no_finish (set below)
    fold: object = None        # None: the aggregate is the sum of the weighed rows (else see the module doc)


@njit(cache=True)
def no_weights(consts, user, row):
    """A plain sum: every user's row counts once."""
    return None


@njit(cache=True)
def no_finish(consts, user, row):
    """The privatized row is sent as it is."""
    return None


Steps.__new__.__defaults__ = (no_finish, None)


@njit(cache=True)
def column_sums(counts):
    """counts.sum(axis=0) of the (n, m) metric counters, in one pass (numpy's reduction over the short inner axis
    makes a loop call per user)."""
    totals = np.zeros(counts.shape[1], dtype=counts.dtype)
    for i in range(counts.shape[0]):
        for j in range(counts.shape[1]):
            totals[j] += counts[i, j]
    return totals


def round_loops(steps: Steps):
    """The loops of a round of users for these steps, with the steps inlined (ldpfed.util.jit), built once per process
    and compiled once per machine (ldpfed.util.jit's disk cache): act, prepare, finish, and the weighted sum or the fold
    of the rows."""
    def build(use):
        act, prepare, finish = use(steps.act), use(steps.prepare), use(steps.finish)
        weigh, fold = use(steps.weigh), use(steps.fold)

        @njit
        def run_act(model, consts, contexts, users, draws, actions):
            for i in range(actions.shape[0]):
                act(model, consts, contexts, i, users[i], draws, actions)

        @njit
        def run_prepare(model, consts, contexts, actions, rewards, users, inputs, counts):
            for i in range(actions.shape[0]):
                prepare(model, consts, contexts, actions, rewards[i], users[i], i, inputs, counts)

        @njit
        def run_finish(consts, users, rows):
            for i in range(rows.shape[0]):
                finish(consts, users[i], rows[i])

        @njit
        def run_sum(consts, users, rows, out):
            """out = the rows folded in (Steps.fold), or their weighted sum, in user order."""
            for i in range(rows.shape[0]):
                if fold is None:
                    weigh(consts, users[i], rows[i])
                    for j in range(rows.shape[1]):
                        out[j] += rows[i, j]
                else:
                    fold(consts, users[i], rows[i], out)

        return run_act, run_prepare, run_finish, run_sum

    return loops(("round",) + tuple(steps), build)


def weight_loop(steps: Steps):
    """run(consts, users, largest, total): entry-wise the largest |weight| and the sum of the weights that `weigh`
    gives the users' rows (a row of ones weighed): the central model's noise scale, the shuffle model's mean."""
    def build(use):
        weigh = use(steps.weigh)

        @njit
        def run(consts, users, largest, total):
            row = np.empty(largest.shape[0])
            for i in range(users.shape[0]):
                row[:] = 1.0
                weigh(consts, users[i], row)
                for j in range(largest.shape[0]):
                    largest[j] = max(largest[j], abs(row[j]))
                    total[j] += row[j]

        return run

    return loops(("central-weights", steps.weigh), build)


def client_sum_loop(steps: Steps):
    """run(consts, users, rows, out): each user's own share of the aggregate, out[i] = its row weighed (`weigh`) or
    folded into a zeroed aggregate row (`fold`): what a user sends when it applies the public weights itself (a
    trust model whose server can only add: TrustModel.client_weighs)."""
    def build(use):
        weigh, fold = use(steps.weigh), use(steps.fold)

        @njit
        def run(consts, users, rows, out):
            for i in range(rows.shape[0]):
                if fold is None:
                    weigh(consts, users[i], rows[i])
                    for j in range(rows.shape[1]):
                        out[i, j] = rows[i, j]
                else:
                    fold(consts, users[i], rows[i], out[i])

        return run

    return loops(("client-sums",) + tuple(steps), build)


class CompiledAlgorithm(Algorithm):
    """An algorithm given as compiled per-user steps (`steps()` returns them as Steps); the batched methods below
    run them, and so does the sequential engine.

    Declarations: `state_keys` (the state dict's arrays, in the order the compiled functions get them),
    `model_keys` (those every user sees), `metric_names` (prepare's counters), `act_draws` (act's random numbers
    per user; a class attribute, or set in setup() when it depends on the instance, e.g. self.act_draws = self.K),
    `action_shape`. Python methods: setup() and fields() (as every Algorithm), consts(), initial_state(rng), and
    the optional draw_act, draw_server, breaks/between, sum_fields."""

    state_keys: tuple = ()       # the state dict's arrays, in the order the compiled functions get them
    model_keys: tuple = ()       # the state arrays every user sees (the published model), in that order
    metric_names: tuple = ()     # prepare's counters, in the order it writes them
    act_draws: int = 0           # act's random numbers per user (draw_act's columns; may be set in setup())
    action_shape: tuple = ()     # one user's action: () an arm index (int64), (d,) a point (float64)

    def steps(self) -> Steps:
        raise NotImplementedError

    # the batched methods the steps replace; a subclass that writes one of them by hand is not written once, and
    # the sequential engine then does not run it
    BATCHED = ("act", "encode", "aggregate", "update", "publish")

    def compiled_steps(self) -> Steps | None:
        """The steps, when every batched method is the one derived from them (else None)."""
        cls = type(self)
        if any(getattr(cls, name) is not getattr(CompiledAlgorithm, name) for name in self.BATCHED):
            return None
        return self.steps()

    def consts(self) -> tuple:
        """The constants of the compiled functions (a tuple of floats, ints, arrays), from the validated options.
        Called once, on the first use of the row layout (`layout()`), which may be while the trust model builds the
        algorithm (under "central" it derives its twins through layout()): field_noise() is not known yet and
        raises there; a compiled update that corrects for noise reads field_noise() in initial_state() and keeps
        it in a state array."""
        return ()

    def sum_fields(self) -> dict | None:
        """The aggregate's fields {name: shape} when the steps fold the rows into it (Steps.fold); None: the
        aggregate has the message's fields."""
        return None

    def draw_server(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """The server's random numbers for the n users of an update, shape (n, q), drawn from the round's server
        Generator (the sequential engine's server stream at B = 1); the compiled update gets them as `server`, row
        i for user start + i (e.g. normals for a Thompson draw). Default (n, 0): none."""
        return np.zeros((n, 0))

    def breaks(self, start: int, stop: int) -> list:
        """The users u in (start, stop] after whose update `between` runs (e.g. the last user of an episode);
        none by default. The sequential engine runs `between` right after user u's update; the batched `update`
        runs it once, after the round's compiled update, with stop the round's end."""
        return []

    def between(self, state: dict, stop: int, rng: np.random.Generator) -> None:
        """A step in plain Python (numpy, scipy) on the state dict, in place, after the update of the users up to
        `stop`, when `breaks` names a user of the update (e.g. a LASSO solve at the end of an episode); `rng`: a
        Generator of the server's."""

    def round_weights(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(largest |weight|, mean weight) of the users [start, stop), entry-wise over the message row."""
        layout = self.layout()
        largest, total = np.zeros(layout.width), np.zeros(layout.width)
        weight_loop(self.steps())(self.compiled_consts(), np.arange(start, stop, dtype=np.int64), largest, total)
        return largest, total / max(stop - start, 1)

    def weighs(self) -> bool:
        """Whether the aggregate weighs the users' rows by public per-user weights (`weigh` is not no_weights)."""
        return self.steps().weigh is not no_weights

    def client_sums(self, rows: np.ndarray, users: np.ndarray) -> np.ndarray:
        """(n, aggregate width): each user's row weighed or folded on its own (the aggregate is their plain sum)."""
        rows = np.array(rows, dtype=float, copy=True)        # weighing works in place
        out = np.zeros((rows.shape[0], self.sum_layout().width))
        client_sum_loop(self.steps())(self.compiled_consts(), np.asarray(users, dtype=np.int64), rows, out)
        return out

    def sent_layout(self) -> FieldLayout:
        """The layout of what a user sends: the message's (`layout()`), or the aggregate's (`sum_layout()`) when the
        trust model has the users weigh or fold their own rows (`client_weighs`)."""
        return self.sum_layout() if self.trust_model().client_weighs else self.layout()

    def anonymous_sums(self) -> bool:
        """Under the shuffle model the server sees a round's messages as a multiset, so it cannot weigh a message
        by its user's index (and weighing at the client would give the index away, e.g. in the norm of eta_t Z):
        the aggregate is then the plain sum of the messages, and `update` applies the round's mean weight to it.
        The expectation is unchanged where the users of a round are exchangeable (they all act on one published
        model)."""
        return self.shuffle is not None and self.steps().weigh is not no_weights

    def central_sources(self) -> dict | None:
        """Under the central trust model: {aggregate field: the message field whose values it carries}, where each
        user adds its message field's value to the aggregate field times the public entry-wise weight of `weigh`
        (1 with no weights or a fold). Derived for plain sums; an algorithm that weighs or folds declares it (None:
        the central model is refused), since the server's noise is calibrated from it."""
        steps = self.steps()
        if steps.weigh is no_weights and steps.fold is None:
            return {key: key for key in self.layout().names}
        return None

    def central_touched(self, sums: dict, start: int, stop: int) -> dict:
        """Under the central trust model: {aggregate field: 0/1 array of its shape}, the entries that some user of
        [start, stop) can have put data in, known from public information only (the server adds noise there and
        nowhere else: an entry no user's data reaches hides no one). Default: for a message field with a public
        `slots` schedule, the slots some user sends; every entry otherwise. An algorithm whose public fields say
        more (the pulled arms) narrows it."""
        touched = {}
        users = np.arange(start, stop, dtype=np.int64)
        for target, source in self.central_sources().items():
            shape = self.sum_layout().shapes[target]
            slots = self._fields[source].schedule.get("slots")
            if slots is None or len(users) == 0:
                touched[target] = np.ones(shape)
                continue
            sent = np.asarray(slots(users)).any(axis=0).astype(float)
            touched[target] = np.broadcast_to(sent.reshape(sent.shape + (1,) * (len(shape) - sent.ndim)), shape)
        return touched

    # ---- what the engines use ------------------------------------------------------------------------------------
    def layout(self) -> FieldLayout:
        """Where each message field sits in a user's row and which mechanism privatizes it, with the mechanisms'
        parameters copied in: built once, on first use, so the mechanisms are fixed after setup() (a test that
        swaps one must do it before the first message)."""
        if "_layout" not in self.__dict__:
            if self._fields is None:
                raise NotImplementedError(f"{self.name}: a compiled algorithm declares fields()")
            self._layout = FieldLayout({key: (f.shape, f.mechanism) for key, f in self._fields.items()})
            self._consts = self.consts()
        return self._layout

    def compiled_consts(self) -> tuple:
        """consts(), built once (with the layout)."""
        self.layout()
        return self._consts

    def sum_layout(self) -> FieldLayout:
        """Where each aggregate field sits in the aggregate row: the message's layout, or sum_fields() (built once)."""
        if "_sum_layout" not in self.__dict__:
            declared = self.sum_fields()
            self._sum_layout = (self.layout() if declared is None else
                                FieldLayout({key: (shape, None) for key, shape in declared.items()}))
        return self._sum_layout

    def state_tuple(self, state: dict) -> tuple:
        return tuple(state[key] for key in self.state_keys)

    def model_tuple(self, model: dict) -> tuple:
        return tuple(model[key] for key in self.model_keys)

    def new_actions(self, n: int) -> np.ndarray:
        return np.zeros((n, *self.action_shape)) if self.action_shape else np.zeros(n, dtype=np.int64)

    def draw_act(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """act's random numbers for n users, shape (n, act_draws): uniforms by default; override it for another
        law (e.g. rng.standard_normal((n, self.act_draws))). Compiled code does not check bounds, so the shape
        must match act_draws (the conformance kit's contract check compares them)."""
        return rng.random((n, self.act_draws)) if self.act_draws else np.zeros((n, 0))

    def client_inputs(self, model, contexts, actions, rewards, users) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, counts): every user's row of clipped data (what the fields' mechanisms are given) and metric
        counters. The conformance kit reads the inputs to check clipping."""
        n = len(users)
        layout = self.layout()
        inputs = np.zeros((n, layout.width))
        counts = np.zeros((n, len(self.metric_names)), dtype=np.int64)
        run_prepare = round_loops(self.steps())[1]
        run_prepare(self.model_tuple(model), self.compiled_consts(),
                    self.context_rows(contexts, n), np.asarray(actions), np.asarray(rewards, dtype=float),
                    np.asarray(users, dtype=np.int64), inputs, counts)
        return inputs, counts

    @staticmethod
    def context_rows(contexts, n: int) -> np.ndarray:
        return np.zeros((n, 0)) if contexts is None else np.asarray(contexts, dtype=float)

    # ---- the batched methods, from the steps ---------------------------------------------------------------------
    def publish(self, state):
        return {key: state[key] for key in self.model_keys}

    def act(self, model, contexts, users, rng):
        n = len(users)
        actions = self.new_actions(n)
        draws = self.draw_act(n, rng)
        round_loops(self.steps())[0](self.model_tuple(model), self.compiled_consts(), self.context_rows(contexts, n),
                np.asarray(users, dtype=np.int64), draws, actions)
        return actions

    def encode(self, model, contexts, actions, rewards, users, rng):
        inputs, counts = self.client_inputs(model, contexts, actions, rewards, users)
        users = np.asarray(users, dtype=np.int64)
        trust = self.trust_model()
        rows = trust.client_rows(self, inputs, users, rng)     # where the noise goes: the trust model's door
        finish = self.steps().finish
        if finish is not no_finish:
            round_loops(self.steps())[2](self.compiled_consts(), users, rows)
        rows = trust.seal(self, rows, users, rng)
        totals = column_sums(counts)
        return self.sent_layout().split(rows), {name: int(totals[j]) for j, name in enumerate(self.metric_names)}

    def aggregate(self, messages, users):
        steps = self.steps()
        if self.trust_model().client_weighs or (
                (steps.weigh is no_weights or self.anonymous_sums()) and steps.fold is None):
            return super().aggregate(messages, users)
        layout, sums = self.layout(), self.sum_layout()
        users = np.asarray(users, dtype=np.int64)
        rows = layout.join(messages, len(users))     # a copy: weighing in place leaves the messages alone
        out = np.zeros(sums.width)
        round_loops(steps)[3](self.compiled_consts(), users, rows, out)
        return {key: value[0] for key, value in sums.split(out[None, :]).items()}

    def aggregate_bounds(self, users):
        """Plain sums: each field's domain summed over the users; a weighted aggregate declares its own."""
        if (self.steps().weigh is not no_weights and not self.anonymous_sums()) or self.steps().fold is not None:
            raise NotImplementedError(f"{self.name}: aggregate is weighted or folded; declare aggregate_bounds")
        return {field: domain.sum_bounds(users) for field, domain in self.cached_domains().items()}

    def update(self, state, sums, start, stop, rng):
        """The batched update: copies the state, runs the compiled Steps.update on the copy (in place) with the
        summed fields joined into one flat row and draw_server's numbers, then `between` when breaks(start, stop)
        names a user; returns the new state (the argument is left alone)."""
        new = {key: np.array(value, copy=True) for key, value in state.items()}
        trust = self.trust_model()
        joined = trust.decode(self, self.sum_layout().join(sums), int(start), int(stop))
        if self.anonymous_sums():
            joined = joined * self.round_weights(int(start), int(stop))[1]
        noise = trust.server_noise(self, sums, int(start), int(stop), rng)
        if noise is not None:
            joined = joined + noise
        self.steps().update(self.state_tuple(new), self.compiled_consts(), joined, int(start),
                            int(stop), self.draw_server(int(stop) - int(start), rng))
        if self.breaks(int(start), int(stop)):
            self.between(new, int(stop), rng)
        return new
