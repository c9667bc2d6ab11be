"""An algorithm's options: `Option` (ldpfed.util.options, where envs declare theirs too) and the options several
algorithms share."""
from __future__ import annotations

from ldpfed.util.options import KINDS, Option, options_from_defaults

__all__ = ["CALIBRATION", "KINDS", "Option", "options_from_defaults"]

# ---- options several algorithms share ------------------------------------------------------------------------
CALIBRATION = Option("classic", kind="choice", choices=("classic", "analytic"),
                     doc="Gaussian calibration: 'classic' (sigma = Delta sqrt(2 ln(1.25/delta)) / eps, proven for "
                         "eps <= 1; above, replaced by the analytic sigma where it would under-state delta) or "
                         "'analytic' (the exact smallest sigma, Balle & Wang 2018)")
