"""``tokenomy demo``: the live stack (emulated P/D cluster, AMPD gateway, two tenants' agents, a
runaway agent), run end to end and stopped; see :mod:`tokenomy.demo.live`."""

from tokenomy.demo.live import run_live_demo
from tokenomy.demo.scenario import DemoSettings

__all__ = ["DemoSettings", "run_live_demo"]
