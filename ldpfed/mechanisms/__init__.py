"""Differential-privacy mechanisms, pure numpy, vectorized over a batch of users (leading axis = users).

Every mechanism keeps the protocol of `protocol.Mechanism` (guarantee, privatize, output_domain, dp_event).
All randomness comes from the numpy.random.Generator passed as `rng`. Bad input raises
ldpfed.util.errors.ConfigError naming the parameter and its value; nothing is clipped silently (only the l2-ball
mechanism clips, and privatize_counted returns the count).
"""

from ._validate import sym_gather_index
from .domains import Domain, SumBounds, gaussian_tail_z, weighted_sphere_bounds
from .gaussian import GaussianMechanism, SymmetricGaussianMechanism, analytic_delta, gaussian_sigma
from .guarantee import Guarantee
from .l2ball import L2BallMechanism, l2_ball_radius
from .laplace import LaplaceMechanism
from .protocol import DataBoundRequired, Mechanism, check_dp_event
from .rr import RandomizedResponse
from .svt import AboveNoisyThreshold, sparse_scales
from .tree import DynamicTreeMechanism, TreeMechanism, TreeNoise, node_draws, tree_depth
from .wishart import WishartMechanism, WishartTree, wishart_dof

__all__ = [
    "sym_gather_index",
    "Domain",
    "SumBounds",
    "gaussian_tail_z",
    "weighted_sphere_bounds",
    "Guarantee",
    "Mechanism",
    "DataBoundRequired",
    "check_dp_event",
    "gaussian_sigma",
    "analytic_delta",
    "GaussianMechanism",
    "SymmetricGaussianMechanism",
    "LaplaceMechanism",
    "l2_ball_radius",
    "L2BallMechanism",
    "RandomizedResponse",
    "TreeNoise",
    "node_draws",
    "TreeMechanism",
    "DynamicTreeMechanism",
    "tree_depth",
    "WishartMechanism",
    "WishartTree",
    "wishart_dof",
    "AboveNoisyThreshold",
    "sparse_scales",
]
