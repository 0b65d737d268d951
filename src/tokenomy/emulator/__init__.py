"""A vLLM-compatible engine emulator: the simulator's engine model behind an OpenAI HTTP API.

The same :class:`tokenomy.engine.Engine` the simulator steps on a virtual clock is stepped here
on the wall clock (:mod:`tokenomy.emulator.driver`), with step times from :mod:`tokenomy.perf`.
See docs/emulator.md for the protocol, the tokenizer, the output rule and the fidelity limits.
"""

from tokenomy.emulator.config import EmulatorConfig
from tokenomy.emulator.server import build_app

__all__ = ["EmulatorConfig", "build_app"]
