"""Heterogeneous populations: regions, devices and cohorts differ. Each population has its own size and its own
world, drawn around the run's one (`Env.varied`: each env says what moves, e.g. theta turned, arm means moved),
so its users have their own best arms; regret is measured against each user's own population's best arm. The
algorithm still sees one public world, the run's. Draws: the sizes once per run, each world once per population,
from the run's seed (Federation.stream)."""
from __future__ import annotations


import numpy as np

from ldpfed.federation.base import Federation, check_one_per_population, per_population_numbers
from ldpfed.util.errors import ConfigError
from ldpfed.util.options import Option


class Heterogeneous(Federation):
    """Populations of different sizes, each with its own world drawn around the run's (spread)."""

    name = "heterogeneous"
    about = ("populations differ: each has its own world drawn around the run's (spread) and its own size (sizes, "
             "or drawn with size_alpha); regret against each population's own best arm")
    options = {
        "spread": Option(0.1, low=0, doc="how far a population's world is from the run's (0: the same world; the env "
                                         "says what moves: `describe ENV`, 'varies')"),
        "sizes": Option(None, kind="any", doc="a list of one positive relative size per population; none: equal"),
        "size_alpha": Option(None, low=0, low_open=True, allow=(None,),
                             doc="draw the populations' relative sizes once per run from a Dirichlet with this "
                                 "concentration (small: very uneven); none: equal or `sizes`"),
    }

    def __init__(self, seed=0, populations=1, options=None):
        super().__init__(seed, populations, options)
        self.worlds: dict = {}
        sizes, alpha = self.options["sizes"], self.options["size_alpha"]
        if sizes is not None:
            self.relative_sizes = np.asarray(sizes, dtype=float)
        elif alpha is not None:
            self.relative_sizes = self.stream("shares", 0).dirichlet(np.full(self.populations, float(alpha)))
        else:
            self.relative_sizes = None

    @classmethod
    def checked_options(cls, given) -> dict:
        options = super().checked_options(given)
        sizes = options["sizes"]
        if sizes is not None:
            sizes = per_population_numbers(sizes, "sizes", "finite numbers > 0", 0.0, float("inf"), low_open=True)
            if options["size_alpha"] is not None:
                raise ConfigError("federation_options.size_alpha", options["size_alpha"],
                                  "give sizes or size_alpha, not both")
            options["sizes"] = sizes
        return options

    def check(self, config) -> None:
        super().check(config)
        check_one_per_population(self.options, config, {"sizes": "sizes"})
        from ldpfed.envs import ENVS

        if self.options["spread"] > 0 and not ENVS[config.env].varies:
            raise ConfigError("env", config.env, f"env {config.env} does not say how its world varies (Env.varied): "
                                                 f"the heterogeneous federation model cannot give its populations "
                                                 f"worlds of their own; use spread=0 or another env")

    def shares(self):
        return self.relative_sizes

    def world(self, env, population):
        if population not in self.worlds:
            try:
                self.worlds[population] = env.varied(self.options["spread"], self.stream("world", population))
            except NotImplementedError as error:     # an env whose `varies` promises what its `_vary` lacks
                raise ConfigError("env", env.name, f"{error}: the heterogeneous federation model cannot give its "
                                                   f"populations worlds of their own; use spread=0 or another env") \
                    from error
        return self.worlds[population]
