"""The single-process engine: the reference every other engine must reproduce, and the fast path for tests."""
from __future__ import annotations

from ldpfed.trust import trust_model
from ldpfed.engine.core import PopulationRow, add_sums, population_round, round_users, shuffled_sums
from ldpfed.federation import federation_model
from ldpfed.engine.driver import Backend, drive
from ldpfed.util.memory import keep_freed_memory


class LocalBackend(Backend):
    """Every population of a round in this process, one after the other, their sums added in population order.
    Under the shuffle trust model the round's messages go through the shuffle plan instead (`shuffled_sums`): the
    same permutation and chunk sums as the Ray engine's shuffler actors and shards."""

    name = "single-process"

    def open(self, config, algo, env, first_round):
        self.config, self.algo, self.env = config, algo, env
        self.shuffled = trust_model(config).shuffles
        self.federation = federation_model(config)
        keep_freed_memory()     # the populations' arrays reuse freed memory instead of faulting in new pages

    def simulate(self, model, round_index, start, stop):
        config = self.config
        sums, rows, messages = None, [], []
        for p in range(config.populations):
            users = round_users(self.federation, round_index, start, stop, p, config.populations)
            if len(users) == 0:
                continue
            payload, regret, metrics, late, on_time = population_round(
                self.federation, self.algo, self.env, model, config.seed, round_index, p, users,
                pre_aggregate=not self.shuffled)
            if self.shuffled:
                messages.append((on_time, payload))
            elif payload:
                sums = add_sums(sums, payload)
            rows.append(PopulationRow.of(p, users, payload, regret, metrics, late, on_time))
        if self.shuffled:
            sums = shuffled_sums(self.algo, config, round_index, messages)
        return sums or {}, rows


def run_local(config, progress=None, checkpointer=None):
    """Run `config` (a RunConfig) for its T users in rounds of B; `progress(users_done, regret)` is optional;
    `checkpointer` (a `checkpoint.Checkpointer`) writes checkpoints and resumes from its file if there is one."""
    return drive(config, LocalBackend(), progress=progress, checkpointer=checkpointer)
