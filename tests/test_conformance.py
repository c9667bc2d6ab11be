"""The conformance kit (ldpfed/testing.py) on every built-in algorithm, and on broken ones: each check passes the
built-ins and rejects a small algorithm broken on purpose for it, naming the check and the field. The kit is what a
plugin's own tests call, so it must be able to fail: a check that passes everything proves nothing.

The broken algorithms are variants of a tiny LDP algorithm written here (so a refactor of the built-ins cannot
quietly un-break them), or subclasses of built-ins that change them only through the public contract (message
fields, `mechanisms`, the mechanisms' own parameters)."""
import numpy as np
import pytest
from scipy.special import expit

from ldpfed.algorithms import REGISTRY, Algorithm, make_algorithm
from ldpfed.algorithms.glm_ldp import LdpOls
from ldpfed.algorithms.klucb import SWKLUCBCF
from ldpfed.algorithms.ldp_reductions import LdpBcoOnePoint, LdpMabUcb
from ldpfed.algorithms.options import Option
from ldpfed.config import RunConfig
from ldpfed.envs import ENVS, make_env
from ldpfed.mechanisms import Domain, GaussianMechanism
from ldpfed.testing import CHECKS, RAY_SKIP, ConformanceError, check_algorithm
from ldpfed.util.errors import ConfigError

BUILTINS = sorted(name for name in REGISTRY if REGISTRY.source(name) == "ldpfed")
# every built-in on every env it runs on: a few seconds in all
PAIRS = [(name, env) for name in BUILTINS for env in REGISTRY[name].envs() if ENVS.source(env) == "ldpfed"]
ON_RAY = ["ldp-ols", "ldp-sgd-multi", "sw-klucb-cf", "linucb-dgs", "ldp-mab-ucb", "uniform"]
LOCAL = [name for name in CHECKS if name != "engines"]


# ---- every built-in passes --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,env", PAIRS, ids=[f"{name}@{env}" for name, env in PAIRS])
def test_builtin_conforms(name, env):
    report = check_algorithm(name, env, ray=False, checks=LOCAL)
    assert list(report) == LOCAL
    model = REGISTRY[name].privacy_model
    for check, outcome in report.items():
        assert outcome == "passed" or outcome.startswith("skipped: "), (check, outcome)
    # what may be skipped, and why: nothing else
    assert (report["privacy_audit"] == "passed") == (model == "ldp"), report["privacy_audit"]
    assert (report["ledger"] == "passed") == (model != "none"), report["ledger"]
    config = RunConfig(name, env=env, users=120, round_size=12)
    has_public = model != "none" and bool(make_algorithm(make_env(config), config).public_fields)  # fields() sets them
    assert (report["public_fields"] == "passed") == has_public, report["public_fields"]
    for check in ("contract", "clipping", "no_truth"):
        assert report[check] == "passed", (check, report[check])


@pytest.mark.parametrize("name", ON_RAY)
def test_builtin_is_bit_identical_on_every_engine_path(ray_session, name):
    assert check_algorithm(name, ray=True, checks=["engines"]) == {"engines": "passed"}


# ---- a tiny LDP algorithm, and the kit's own behaviour on it ------------------------------------------------------
class Tiny(Algorithm):
    """Round-robin arms (public) on the Bernoulli bandit; each user sends its reward clipped to the public bound
    c_r, plus Gaussian noise calibrated for the range 2 c_r; the server keeps the sums. Conforms."""

    name = "tiny"
    privacy_model = "ldp"
    env_kinds = ("bernoulli",)
    default_env = "bernoulli"
    public_fields = frozenset({"arm"})
    clip_to = 1.0                  # times c_r
    noise_for = 1.0                # the mechanism is calibrated for this fraction of the true sensitivity 2 c_r

    def setup(self):
        self.c_r = float(self.world.reward_bound)
        self.mechanisms["reward"] = GaussianMechanism(2 * self.c_r * self.noise_for, self.eps, self.delta)

    def initial_state(self, rng):
        return {"arm": np.zeros(()), "reward": np.zeros(())}

    def update(self, state, sums, start, stop, rng):
        return {key: state[key] + sums.get(key, 0.0) for key in state}

    def act(self, model, contexts, users, rng):
        return np.asarray(users, dtype=np.int64) % self.K

    def message_spec(self):
        return {"arm": (), "reward": ()}

    def message_domains(self):
        return {"arm": Domain((), low=0, high=self.K - 1, integral=True, source="public arm"),
                "reward": self.mechanisms["reward"].output_domain((), self.c_r)}

    def encode(self, model, contexts, actions, rewards, users, rng):
        bound = self.clip_to * self.c_r
        reward = np.clip(np.asarray(rewards, dtype=float), -bound, bound)
        return {"arm": np.asarray(actions, dtype=np.int64),
                "reward": self.mechanisms["reward"].privatize(reward, rng)}, {}


def test_a_class_defined_here_is_registered_for_the_call_only(monkeypatch):
    monkeypatch.delenv("LDPFED_PLUGINS", raising=False)
    assert "tiny" not in REGISTRY
    report = check_algorithm(Tiny, ray=True)                # Ray is not started: its workers could not build it
    assert list(report) == list(CHECKS)
    assert report["engines"] == f"skipped: {RAY_SKIP} (the local engine was: two runs bit-identical)"
    assert all(v == "passed" for k, v in report.items() if k != "engines"), report
    assert "tiny" not in REGISTRY


def test_a_registered_class_stays_registered():
    REGISTRY.register(Tiny)
    try:
        assert check_algorithm(Tiny, ray=False, checks=["contract"]) == {"contract": "passed"}
        assert REGISTRY["tiny"] is Tiny
    finally:
        REGISTRY.unregister("tiny")


def test_usage_errors_are_config_errors():
    with pytest.raises(ConfigError):
        check_algorithm("ldp-ols", checks=["no-such-check"])
    with pytest.raises(ConfigError):
        check_algorithm("no-such-algorithm")
    with pytest.raises(ConfigError):
        check_algorithm("ldp-ols", env="bernoulli")                 # not one of its envs
    assert list(check_algorithm("ldp-ols", ray=False, checks=["ledger", "contract"])) == ["contract", "ledger"]


def rejected(cls, check, **options) -> ConformanceError:
    """The ConformanceError `check` raises on cls (the kit registers and unregisters it)."""
    with pytest.raises(ConformanceError) as caught:
        check_algorithm(cls, ray=False, checks=[check], **options)
    error = caught.value
    assert isinstance(error, AssertionError)
    assert error.check == check and error.algorithm == cls.name, str(error)
    assert repr(check) in str(error) and repr(cls.name) in str(error)
    assert cls.name not in REGISTRY
    return error


# ---- 1. contract ------------------------------------------------------------------------------------------------
class ShapeLies(LdpMabUcb):
    """Declares a scalar reward per user, sends a column."""
    name = "shape-lies"

    def encode(self, model, contexts, actions, rewards, users, rng):
        messages, metrics = super().encode(model, contexts, actions, rewards, users, rng)
        return {**messages, "reward": messages["reward"][:, None]}, metrics


class RawField(Tiny):
    """Also sends the clipped reward as a field no mechanism made, not public: nothing raw may leave an LDP client."""
    name = "raw-field"

    def message_spec(self):
        return {**super().message_spec(), "raw": ()}

    def message_domains(self):
        return {**super().message_domains(), "raw": Domain((), low=-self.c_r, high=self.c_r, source="raw")}

    def encode(self, model, contexts, actions, rewards, users, rng):
        messages, metrics = super().encode(model, contexts, actions, rewards, users, rng)
        return {**messages, "raw": np.clip(np.asarray(rewards, dtype=float), -self.c_r, self.c_r)}, metrics


class MissingMethods(Algorithm):
    """Writes no initial_state, update or act (refused when registered)."""
    name = "missing-methods"
    privacy_model = "ldp"
    env_kinds = ("bernoulli",)
    default_env = "bernoulli"
    message_spec, encode = Tiny.message_spec, Tiny.encode


def test_contract_rejects_shapes_raw_fields_and_missing_methods():
    assert rejected(ShapeLies, "contract").field == "reward"
    error = rejected(RawField, "contract")
    assert error.field == "raw" and "no mechanism" in str(error)
    with pytest.raises(ConformanceError) as caught:             # refused at registration already
        check_algorithm(MissingMethods, ray=False, checks=["ledger"])
    assert caught.value.check == "contract" and "not implemented" in str(caught.value)
    assert "missing-methods" not in REGISTRY


# ---- 2. ledger --------------------------------------------------------------------------------------------------
class Overspends(Tiny):
    """Counts two outputs per user of a mechanism calibrated for the whole budget: 2 eps."""
    name = "overspends"

    def ledger(self):
        return [{**row, "per_user": 2} for row in super().ledger()]


class ThinNoise(Tiny):
    """Draws a third of the noise its ledger row's claim needs (the row records the noise it draws)."""
    name = "thin-noise"

    def setup(self):
        super().setup()
        self.mechanisms["reward"].sigma /= 3


def test_ledger_rejects_overspending_and_noise_below_the_claim():
    assert "over budget" in str(rejected(Overspends, "ledger"))
    assert "below what its noise gives" in str(rejected(ThinNoise, "ledger"))     # the accountant refuses it


# ---- 3. clipping ------------------------------------------------------------------------------------------------
class NoClip(Tiny):
    """Privatizes the raw reward: the noise covers rewards in [-c_r, c_r] only."""
    name = "no-clip"
    clip_to = np.inf


class ClipsTwice(Tiny):
    """Clips to twice the bound its noise is calibrated for: its messages stay in the domain (the noise tail is
    wide), but the data it privatizes spreads beyond the sensitivity of its ledger row."""
    name = "clips-twice"
    clip_to = 2.0


def test_clipping_rejects_unclipped_inputs():
    error = rejected(NoClip, "clipping")
    assert error.field == "reward" and "outside its domain" in str(error)
    error = rejected(ClipsTwice, "clipping")
    assert error.field == "reward" and "sensitivity" in str(error)


# ---- 4. privacy_audit -------------------------------------------------------------------------------------------
class TenthNoise(Tiny):
    """Its mechanism is built for a tenth of the sensitivity (a tenth of the noise) while its ledger still claims
    the configured (eps, delta): self-consistent on paper, only running it shows the leak."""
    name = "tenth-noise"
    noise_for = 0.1


class TenthNoiseOls(LdpOls):
    """ldp-ols with a tenth of the noise in both its mechanisms, its ledger still claiming (eps/2, delta/2) each."""
    name = "tenth-noise-ols"

    def setup(self):
        super().setup()
        for mech in self.mechanisms.values():
            mech.sigma /= 10


class KeepsTooMuch(SWKLUCBCF):
    """Randomized response that keeps the bit with probability expit(2 eps) while claiming eps."""
    name = "keeps-too-much"

    def setup(self):
        super().setup()
        self.rr.p_keep = float(expit(2 * self.eps))      # the mechanism that fields() declares for "feedback"


def test_privacy_audit_catches_under_noised_mechanisms():
    assert check_algorithm(TenthNoise, ray=False, checks=["contract", "ledger"]) == {
        "contract": "passed", "ledger": "passed"}
    error = rejected(TenthNoise, "privacy_audit")
    assert error.field == "reward" and "told apart beyond the ledger's claim" in str(error)
    rejected(TenthNoiseOls, "privacy_audit")
    assert check_algorithm(KeepsTooMuch, ray=False, checks=["ledger", "clipping"]) == {
        "ledger": "passed", "clipping": "passed"}
    assert rejected(KeepsTooMuch, "privacy_audit").field == "feedback"


# ---- 5. no_truth ------------------------------------------------------------------------------------------------
class Peeks(Tiny):
    """Rebuilds the env from its config (same seed: same ground truth) to peek at the arms' means."""
    name = "peeks"

    def setup(self):
        super().setup()
        self._world_copy = make_env(self.config)


class KeepsMeans(LdpMabUcb):
    """Keeps a copy of the true means only (no env object)."""
    name = "keeps-means"

    def setup(self):
        super().setup()
        self.prior = {"means": make_env(self.config).segment_means.copy()}


def test_no_truth_rejects_an_algorithm_that_reaches_the_env():
    assert "can reach the env" in str(rejected(Peeks, "no_truth"))
    assert "'segment_means'" in str(rejected(KeepsMeans, "no_truth"))


# ---- 6. public_fields -------------------------------------------------------------------------------------------
class ArmByReward(Tiny):
    """Reports the next arm instead of its own when its reward is 1: an arm in the domain, public by declaration,
    but it carries the user's reward in the clear."""
    name = "arm-by-reward"

    def encode(self, model, contexts, actions, rewards, users, rng):
        messages, metrics = super().encode(model, contexts, actions, rewards, users, rng)
        shifted = (messages["arm"] + (np.asarray(rewards) > 0.5)) % self.K
        return {**messages, "arm": shifted.astype(np.int64)}, metrics


class SteersByLoss(LdpBcoOnePoint):
    """Flips its public direction u by a bit of its loss (the parity of its third decimal): a unit vector in the
    domain, but one bit of the user's loss in the clear."""
    name = "steers-by-loss"

    def encode(self, model, contexts, actions, rewards, users, rng):
        messages, metrics = super().encode(model, contexts, actions, rewards, users, rng)
        flip = np.where(np.floor(1e3 * np.asarray(rewards)) % 2 == 1, -1.0, 1.0)
        return {**messages, "u": messages["u"] * flip[:, None]}, metrics


def test_public_fields_rejects_a_data_dependent_public_field():
    error = rejected(ArmByReward, "public_fields")
    assert error.field == "arm" and "depends on their data" in str(error)
    assert rejected(SteersByLoss, "public_fields").field == "u"


# ---- 7. engines -------------------------------------------------------------------------------------------------
class Unseeded(Tiny):
    """Draws its arms from fresh OS entropy instead of the generator it is handed: not reproducible."""
    name = "unseeded"

    def act(self, model, contexts, users, rng):
        return np.random.default_rng().integers(self.K, size=len(users))


def test_engines_rejects_a_non_deterministic_algorithm():
    assert "second local run" in str(rejected(Unseeded, "engines"))


# ---- options and settings ----------------------------------------------------------------------------------------
class ClipOption(Tiny):
    """Conforms at its default; with the option `clip` off it privatizes unclipped rewards."""
    name = "clip-option"
    options = {"clip": Option(True, kind="bool", doc="clip rewards to the public bound before the noise")}

    def encode(self, model, contexts, actions, rewards, users, rng):
        reward = np.asarray(rewards, dtype=float)
        if self.params["clip"]:
            reward = np.clip(reward, -self.c_r, self.c_r)
        return {"arm": np.asarray(actions, dtype=np.int64),
                "reward": self.mechanisms["reward"].privatize(reward, rng)}, {}


def test_algorithm_and_env_options_reach_the_checked_run():
    assert check_algorithm(ClipOption, ray=False, checks=["clipping"]) == {"clipping": "passed"}
    error = rejected(ClipOption, "clipping", params={"clip": False})
    assert error.field == "reward"
    seen = {}

    class SeesK(Tiny):
        name = "sees-k"

        def setup(self):
            seen["K"] = self.K
            super().setup()

    check_algorithm(SeesK, ray=False, checks=["contract"], env_params={"K": 3})
    assert seen["K"] == 3
    with pytest.raises(ConfigError, match="params.clip"):
        check_algorithm(ClipOption, ray=False, checks=["contract"], params={"clip": "sometimes"})
    with pytest.raises(ConfigError, match="no-such-option"):
        check_algorithm(ClipOption, ray=False, checks=["contract"], params={"no-such-option": 1})


def test_a_list_of_settings_is_checked_setting_by_setting():
    settings = [{}, {"env_params": {"K": 3}, "users": 60}, {"params": {"clip": False}}]
    with pytest.raises(ConformanceError) as caught:
        check_algorithm(ClipOption, ray=False, checks=["contract", "clipping"], settings=settings)
    assert caught.value.check == "clipping"
    assert caught.value.algorithm == "clip-option [params={'clip': False}]"
    reports = check_algorithm(ClipOption, ray=False, checks=["contract", "clipping"], settings=settings[:2])
    assert list(reports) == ["", "env_params={'K': 3} users=60"]
    assert all(report == {"contract": "passed", "clipping": "passed"} for report in reports.values())
    with pytest.raises(ConfigError, match="settings"):
        check_algorithm(ClipOption, ray=False, settings=[{"horizon": 5}])


def test_a_draw_act_shorter_than_act_draws_is_caught_before_compiled_code_reads_past_it():
    from ldpfed.algorithms.baselines import Uniform

    class ShortDraws(Uniform):
        name = "short-draws"

        def draw_act(self, n, rng):
            return rng.random((n, 0))          # act reads draws[i, 0]: past the row, silently, in numba

    error = rejected(ShortDraws, "contract")
    assert "draw_act" in error.reason and "act_draws = 1" in error.reason


# ---- the env kit (ldpfed.testing.check_env): every built-in env passes, each broken env fails its check ----------
from dataclasses import replace as _replace  # noqa: E402

from ldpfed.envs.glm import Linear, LinearMulti  # noqa: E402
from ldpfed.testing import ENV_CHECKS, EnvConformanceError, check_env  # noqa: E402

BUILTIN_ENVS = sorted(name for name in ENVS if ENVS.source(name) == "ldpfed")
# small sizes: the kit builds each env a few times and steps every arm of 500 users
SMALL_ENV = {"sparse-linear": {"d": 40, "s0": 3}, "arm-pool": {"pool": 50, "d": 5}, "classification": {"d": 8}}


@pytest.mark.parametrize("env", BUILTIN_ENVS)
def test_builtin_env_conforms(env):
    report = check_env(env, env_params=SMALL_ENV.get(env), users=300, samples=500)
    assert list(report) == list(ENV_CHECKS)
    assert all(outcome == "passed" for check, outcome in report.items() if check not in ("kind", "varied")), report
    assert report["kind"].startswith("skipped: of its own kind only")      # every built-in is its own kind
    # every built-in world varies (the heterogeneous federation model) but the digits' data set
    assert report["varied"] == ("passed" if ENVS[env].varies else report["varied"])
    assert (report["varied"] == "passed") == (env != "classification")


class _KindLinear(Linear):
    """A linear world of kind "linear" (passes every env check)."""
    name = "kind-linear"
    kinds = ("linear",)


class _DoubledRegret(Linear):
    """Reports twice the gap: regret does not match the rewards."""
    name = "doubled-regret"

    def compiled(self):
        return None

    def step(self, contexts, actions, users, rng):
        means = self.means(contexts)
        chosen = means[np.arange(len(actions)), actions]
        return chosen + self.noise_std * rng.standard_normal(len(actions)), 2.0 * (means.max(axis=1) - chosen)


class _OffByOneArm(_DoubledRegret):
    """Reports the gap of the next arm: non-negative, zero somewhere, but not the pulled arm's."""
    name = "off-by-one-arm"

    def step(self, contexts, actions, users, rng):
        means = self.means(contexts)
        n = len(actions)
        chosen = means[np.arange(n), actions]
        other = means[np.arange(n), (actions + 1) % self.K]
        return chosen + self.noise_std * rng.standard_normal(n), means.max(axis=1) - other


class _BatchedDiffers(Linear):
    """Its batched step is not its compiled step."""
    name = "batched-differs"

    def step(self, contexts, actions, users, rng):
        rewards, regret = super().step(contexts, actions, users, rng)
        return rewards + 1e-9, regret


class _LeaksTheta(Linear):
    """Puts a coordinate of theta* in its public description."""
    name = "leaks-theta"

    def public(self):
        return _replace(super().public(), context_min_eig=float(self.theta[0]))


class _Unseeded(Linear):
    """Draws its truth from fresh entropy, not the run's seed."""
    name = "unseeded"

    def __init__(self, rng, users, **params):
        super().__init__(np.random.default_rng(), users, **params)


class _PlainOption(Linear):
    """An undeclared option: accepted as it is, undocumented."""
    name = "plain-option"
    defaults = {**Linear.defaults, "drift": 0.0}


class _NoValidation(Linear):
    """Skips the option checks."""
    name = "no-validation"

    @classmethod
    def checked_params(cls, params, profile="paper", users=None):
        return {**cls.defaults, **params}


class _WrongKind(LinearMulti):
    """Claims kind "linear" with one context per user and a parameter per arm."""
    name = "wrong-kind"
    kinds = ("linear",)


class _UnknownKind(Linear):
    name = "unknown-kind"
    kinds = ("no-such-world",)


def test_an_env_of_a_kind_passes_the_env_kit():
    assert check_env(_KindLinear, users=300, samples=500) == {check: "passed" for check in ENV_CHECKS}
    assert "kind-linear" not in ENVS          # registered for the call only


@pytest.mark.parametrize("cls,check,words", [
    (_DoubledRegret, "regret", "does not match the rewards"),
    (_OffByOneArm, "regret", "does not match the rewards"),
    (_BatchedDiffers, "step", "the batched step gives"),
    (_LeaksTheta, "public", "ground-truth value"),
    (_Unseeded, "public", "depend on the seed only"),
    (_PlainOption, "options", "plain default"),
    (_NoValidation, "options", "accepted nan"),
    (_WrongKind, "kind", "multi"),
    (_UnknownKind, "kind", "not a registered env"),
], ids=lambda v: v.__name__ if isinstance(v, type) else None)
def test_the_env_kit_catches_a_broken_env(cls, check, words):
    with pytest.raises(EnvConformanceError) as info:
        check_env(cls, users=300, samples=500)
    assert info.value.check == check and info.value.env == cls.name, str(info.value)
    assert words in str(info.value), str(info.value)
    assert cls.name not in ENVS


class _VariesInPlace(Linear):
    """Moves the run's own theta instead of a copy's: the varied check must catch it."""
    name = "varies-in-place"
    kinds = ("linear",)

    def _vary(self, spread, rng):
        self.theta += spread * rng.standard_normal(self.theta.shape)


class _VariesWithoutItsGenerator(Linear):
    """Turns theta with a Generator of its own: every population would get the same world."""
    name = "varies-without-its-generator"
    kinds = ("linear",)

    def _vary(self, spread, rng):
        self.theta = self.theta[::-1].copy()


class _StepsAnOldTruth(Linear):
    """Caches its compiled step under a name of its own: a varied copy would step the run's theta."""
    name = "steps-an-old-truth"
    kinds = ("linear",)

    def compiled(self):
        if "_cached" not in self.__dict__:
            self._cached = super().compiled()
        return self._cached


@pytest.mark.parametrize("cls, words", [
    (_VariesInPlace, "changed the run's own world"),
    (_VariesWithoutItsGenerator, "it draws nothing from rng"),
    (_StepsAnOldTruth, "steps as the run's world does"),
], ids=lambda v: v.__name__ if isinstance(v, type) else None)
def test_the_env_kit_catches_a_world_that_does_not_vary_as_it_should(cls, words):
    with pytest.raises(EnvConformanceError, match=words) as caught:
        check_env(cls, users=300, samples=500, checks="varied")
    assert caught.value.check == "varied"
    assert check_env(Linear, users=300, samples=500, checks="varied") == {"varied": "passed"}
