"""Run sweep jobs as Ray tasks (optional extra: ``pip install 'tokenomy[ray]'``).

``address``: ``"local"`` starts a private Ray instance in this process (``num_cpus=workers``)
and shuts it down afterwards; ``"auto"`` joins the cluster already running on this machine
(``ray start --head``); anything else is a cluster address (``ray://host:10001`` or
``host:6379``). Each task runs :func:`tokenomy.experiment.jobs.run_job`, so the numbers are
the ones the process pool gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tokenomy.experiment.jobs import Job, run_job
from tokenomy.experiment.results import RunResult
from tokenomy.experiment.spec import ExperimentSpec

RAY_DID_NOT_START = "Ray did not start or could not be reached"


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ValueError("--ray needs Ray: pip install 'tokenomy[ray]'") from None
    return ray


def run_on_ray(spec: ExperimentSpec, jobs: list[Job], workers: int, address: str | None) -> Iterator[tuple[Job, RunResult]]:
    """``(job, result)`` in completion order; a failed task raises its error here."""
    ray = _ray()
    try:
        if address in (None, "local"):
            ray.init(num_cpus=max(1, workers), include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
    except (ConnectionError, RuntimeError, TimeoutError, SystemExit) as exc:
        # Ray turns a start-up timeout into SIGTERM -> SystemExit; report it as the user error it is.
        ray.shutdown()
        why = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"--ray {address or 'local'}: {RAY_DID_NOT_START} ({why})") from None
    try:
        task = ray.remote(num_cpus=1)(run_job)
        pending = {task.remote(spec, job): job for job in jobs}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                yield pending.pop(ref), ray.get(ref)
    finally:
        ray.shutdown()
