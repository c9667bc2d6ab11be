"""An algorithm's options (`Option`, declared once: default, kind, bounds, documentation): ldpfed.util.options, where
trust models and envs find them too. This module is the path algorithm plugins import them from."""
from ldpfed.util.options import CALIBRATION, KINDS, Option, options_from_defaults

__all__ = ["CALIBRATION", "KINDS", "Option", "options_from_defaults"]
