"""Differential-privacy mechanisms, pure numpy, vectorized over a batch of users (leading axis = users).

All randomness comes from the numpy.random.Generator passed as `rng`. Bad input raises
ldpfed.errors.ConfigError naming the parameter and its value; nothing is clipped silently (only the l2-ball
mechanism clips, and it returns the count).
"""

from .domains import Domain, SumBounds, gaussian_tail_z, weighted_sphere_bounds
from .gaussian import GaussianMechanism, SymmetricGaussianMechanism, analytic_delta, gaussian_sigma
from .guarantee import Guarantee
from .l2ball import L2BallMechanism, l2_ball_radius
from .laplace import LaplaceMechanism
from .rr import RandomizedResponse
from .svt import AboveNoisyThreshold, sparse_scales
from .tree import TreeMechanism, TreeNoise, tree_depth
from .wishart import WishartMechanism, wishart_dof

__all__ = [
    "Domain",
    "SumBounds",
    "gaussian_tail_z",
    "weighted_sphere_bounds",
    "Guarantee",
    "gaussian_sigma",
    "analytic_delta",
    "GaussianMechanism",
    "SymmetricGaussianMechanism",
    "LaplaceMechanism",
    "l2_ball_radius",
    "L2BallMechanism",
    "RandomizedResponse",
    "TreeNoise",
    "TreeMechanism",
    "tree_depth",
    "WishartMechanism",
    "wishart_dof",
    "AboveNoisyThreshold",
    "sparse_scales",
]
