"""Pure scheduling policies: routers and AMPD decision objects.

Policies read :mod:`tokenomy.policy.view` views and an :class:`~tokenomy.policy.estimator.Estimator`,
are given ``now``, and never do I/O, read a clock or import the simulator, gateway, emulator or bench.
"""

from tokenomy.policy import closedloop  # noqa: F401  (registers the closed loop's router and policies)
from tokenomy.policy.estimator import Estimator
from tokenomy.policy.registry import Registry
from tokenomy.policy.router import ROUTERS, Router, make_router
from tokenomy.policy.view import InstanceView

__all__ = ["ROUTERS", "Estimator", "InstanceView", "Registry", "Router", "make_router"]
