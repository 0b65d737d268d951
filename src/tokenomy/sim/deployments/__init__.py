"""Simulated deployments; importing this package registers them."""

from tokenomy.sim.deployments import colocated, disagg

__all__ = ["colocated", "disagg"]
