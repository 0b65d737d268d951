"""Discrete-event cluster simulator: engine instances on a virtual clock under a deployment."""

from tokenomy.sim.config import SimConfig
from tokenomy.sim.runner import SimResult, simulate

__all__ = ["SimConfig", "SimResult", "simulate"]
