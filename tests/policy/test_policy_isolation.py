"""`policy` stays pure: it imports nothing from sim/gateway/emulator/bench and reads no clock."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tokenomy.policy
from helpers.imports import imported_names

FORBIDDEN_PACKAGES = ("tokenomy.sim", "tokenomy.gateway", "tokenomy.emulator", "tokenomy.bench")
FORBIDDEN_STDLIB = ("time", "datetime", "random", "os", "socket", "subprocess")
POLICY_DIR = Path(tokenomy.policy.__file__).resolve().parent

IMPORT_ALL = """
import importlib, pkgutil, sys
import tokenomy.policy as pkg
for m in pkgutil.walk_packages(pkg.__path__, "tokenomy.policy."):
    importlib.import_module(m.name)
print("\\n".join(sorted(sys.modules)))
"""


def test_importing_every_policy_module_loads_nothing_from_sim() -> None:
    out = subprocess.run([sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded = out.stdout.split()
    # the walk did import the package, the decision-makers sim and gateway share among them
    for module in ("placement", "dispatch", "tool_latency", "host_tier", "retention", "admission", "factory"):
        assert f"tokenomy.policy.ampd.{module}" in loaded
    assert "tokenomy.policy.trace" in loaded
    leaked = [m for m in loaded if m.startswith(FORBIDDEN_PACKAGES)]
    assert leaked == []


def test_no_policy_source_imports_sim_or_reads_the_clock() -> None:
    sources = sorted(POLICY_DIR.rglob("*.py"))
    assert len(sources) >= 13
    bad = {
        str(p.relative_to(POLICY_DIR)): sorted(
            n
            for n in imported_names(p)
            if n.startswith(FORBIDDEN_PACKAGES) or n.split(".")[0] in FORBIDDEN_STDLIB
        )
        for p in sources
    }
    assert {k: v for k, v in bad.items() if v} == {}
