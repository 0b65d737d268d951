"""What the command modules share: the one-line user error and the parser that reports usage
errors on one line (:mod:`tokenomy.cli.main` builds the ``tokenomy`` command from them)."""

from __future__ import annotations

import argparse
from typing import NoReturn


class CLIError(Exception):
    """A user error: printed as one line, exit status 2, never a traceback."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``tokenomy sim: error: ...``), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
