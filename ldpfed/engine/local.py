"""The single-process engine: the reference every other engine must reproduce, and the fast path for tests."""
from __future__ import annotations

from ldpfed.engine.core import PopulationRow, add_sums, population_users, simulate_population
from ldpfed.engine.driver import Backend, drive
from ldpfed.memory import keep_freed_memory


class LocalBackend(Backend):
    """Every population of a round in this process, one after the other, their sums added in population order."""

    name = "single-process"

    def open(self, config, algo, env, first_round):
        self.config, self.algo, self.env = config, algo, env
        keep_freed_memory()     # the populations' arrays reuse freed memory instead of faulting in new pages

    def simulate(self, model, round_index, start, stop):
        config = self.config
        sums, rows = None, []
        for p in range(config.populations):
            users = population_users(start, stop, p, config.populations)
            if len(users) == 0:
                continue
            payload, regret, metrics = simulate_population(self.algo, self.env, model, config.seed, round_index, p,
                                                           users)
            sums = add_sums(sums, payload)
            rows.append(PopulationRow.of(p, users, payload, regret, metrics))
        return sums or {}, rows


def run_local(config, progress=None, checkpointer=None):
    """Run `config` (a RunConfig) for its T users in rounds of B; `progress(users_done, regret)` is optional;
    `checkpointer` (a `checkpoint.Checkpointer`) writes checkpoints and resumes from its file if there is one."""
    return drive(config, LocalBackend(), progress=progress, checkpointer=checkpointer)
