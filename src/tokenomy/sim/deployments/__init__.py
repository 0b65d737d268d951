"""Simulated deployments; importing this package registers them."""

from tokenomy.sim.deployments import ampd, colocated, disagg

__all__ = ["ampd", "colocated", "disagg"]
