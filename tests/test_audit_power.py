"""The privacy audit's power (ldpfed.mechanisms.audit.audit_samples, run by the conformance kit on every mechanism of
an LDP algorithm): it is planned to flag a mechanism whose noise is 1/1.5 of what it claims with probability
>= 0.95, for every mechanism kind ldpfed ships and for a plugin's own mechanism, while a calibrated mechanism fails
it with probability at most alpha.

The planted cases are jobs/audit_power.py's (the job that draws the power curve). The slow tests measure rates over
fixed seeds and assert them with one-sided binomial bounds: at noise 1/1.5 the 95% Clopper-Pearson lower bound on
the detection rate is >= 0.95; calibrated mechanisms are flagged no more often than the 99% quantile of
Binomial(seeds, alpha), at the kit's alpha and at alpha = 0.25 (where a bound that is not valid would show).
The fast tests: the kit on a plugin algorithm and on a compiled algorithm whose mechanism declares more noise than
it draws."""
import importlib.util
from pathlib import Path

import pytest
from scipy import special, stats

from ldpfed import testing
from ldpfed.algorithms.ldp_reductions import LdpMabUcb
from ldpfed.mechanisms import GaussianMechanism
from ldpfed.testing import AUDIT_ALPHA, ConformanceError, check_algorithm

JOB = Path(__file__).resolve().parent.parent / "jobs" / "audit_power.py"
spec = importlib.util.spec_from_file_location("audit_power", JOB)
power = importlib.util.module_from_spec(spec)
spec.loader.exec_module(power)

DESIGN_SEEDS = 300          # at noise 1/1.5: the 95% lower bound is >= 0.95 with at most 8 misses
CALIBRATED_SEEDS = 200


def _rate(kind, ratio, seeds, alpha):
    return sum(power.flagged(kind, ratio, seed, alpha) for seed in range(seeds))


def _lower95(k, n):
    return 0.0 if k == 0 else float(special.betaincinv(k, n - k + 1, 0.05))


# ---- the kit, fast ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ratio", [1.0, 1.5, 2.0])
def test_the_kit_flags_a_plugin_mechanism_with_less_noise_than_its_dp_event(ratio):
    """The plugin's own mechanism (no ldpfed class) declares Gaussian noise of the classic calibration and draws
    that divided by `ratio`: its ledger is consistent on paper, the privacy audit finds the noise missing."""
    cls = power.plugin_algorithm(ratio)
    assert check_algorithm(cls, ray=False, checks=["contract", "ledger"]) == {"contract": "passed",
                                                                             "ledger": "passed"}
    for seed in range(3):
        if ratio == 1.0:
            assert check_algorithm(cls, seed=seed, ray=False, checks=["privacy_audit"]) == {
                "privacy_audit": "passed"}
            continue
        with pytest.raises(ConformanceError) as error:
            check_algorithm(cls, seed=seed, ray=False, checks=["privacy_audit"])
        assert error.value.check == "privacy_audit" and error.value.field == "reward"
        assert "PluginGaussian" in str(error.value) and "declared mu" in str(error.value)


class _DeclaresMore(GaussianMechanism):
    """Draws 1/1.5 of the noise its dp_event declares (its compiled row kernel reads the smaller sigma)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.declared = self.sigma
        self.sigma /= 1.5

    def dp_event(self):
        return {**super().dp_event(), "noise_std": float(self.declared)}


class UnderNoisedMabUcb(LdpMabUcb):
    """ldp-mab-ucb (written once: compiled rows privatize its reward) with _DeclaresMore as its mechanism."""
    name = "under-noised-mab-ucb"

    def _build_mechanism(self, bound):
        mech = _DeclaresMore(2.0 * bound, self.eps, self.delta, calibration=self.params["calibration"])
        self.mechanisms[self.private_field] = mech
        return mech.sigma


def test_the_kit_audits_the_compiled_rows_an_algorithm_written_once_runs():
    assert check_algorithm(UnderNoisedMabUcb, ray=False, checks=["ledger", "clipping"]) == {
        "ledger": "passed", "clipping": "passed"}
    with pytest.raises(ConformanceError) as error:
        check_algorithm(UnderNoisedMabUcb, ray=False, checks=["privacy_audit"])
    assert error.value.field == "reward" and "_DeclaresMore" in str(error.value)
    assert check_algorithm("ldp-mab-ucb", ray=False, checks=["privacy_audit"]) == {"privacy_audit": "passed"}


# ---- the rates, slow ----------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("kind", power.KINDS)
def test_power_at_the_design_point(kind):
    hits = _rate(kind, 1.5, DESIGN_SEEDS, AUDIT_ALPHA)
    print(f"\n[power] {kind}: noise 1/1.5 flagged {hits}/{DESIGN_SEEDS}, 95% lower bound "
          f"{_lower95(hits, DESIGN_SEEDS):.3f}")
    assert _lower95(hits, DESIGN_SEEDS) >= 0.95, (kind, hits)


@pytest.mark.slow
@pytest.mark.parametrize("kind", power.KINDS)
def test_calibrated_mechanisms_are_flagged_at_most_at_rate_alpha(kind, monkeypatch):
    for alpha in (AUDIT_ALPHA, 0.25):
        monkeypatch.setattr(testing, "AUDIT_ALPHA", alpha)         # the kit's share of it, for "plugin-kit"
        hits = _rate(kind, 1.0, CALIBRATED_SEEDS, alpha)
        allowed = stats.binom.ppf(0.99, CALIBRATED_SEEDS, alpha)
        print(f"\n[power] {kind}: calibrated flagged {hits}/{CALIBRATED_SEEDS} at alpha = {alpha:g} (allowed "
              f"{allowed:.0f})")
        assert hits <= allowed, (kind, alpha, hits)


@pytest.mark.slow
@pytest.mark.parametrize("ratio", [2.0, 3.0])
def test_power_beyond_the_design_point(ratio):
    """Noise 1/2 and 1/3 (the outside audit's cases): 60 seeds per kind, the 95% lower bound >= 0.95."""
    for kind in power.KINDS:
        hits = _rate(kind, ratio, 60, AUDIT_ALPHA)
        assert _lower95(hits, 60) >= 0.95, (kind, ratio, hits)
