"""``srdq`` with faults injected into its engine, for the isolation tests only:
``python -m tests.integration.fault_cli worker ...`` (or ``run ...``) is the real CLI, except that the
engine registry wraps every transformers engine it builds in ``tests.faults.FaultyEngine``, configured
from the environment:

- ``SRDQ_TEST_POISON``: a request whose prompt contains this text raises;
- ``SRDQ_TEST_OOM_ABOVE``: a batch of more requests than this raises ``torch.OutOfMemoryError``;
- ``SRDQ_TEST_PER_REQUEST=1``: generate request by request (results independent of the batch
  composition, which an out-of-memory error changes differently in a fleet's slices and ``srdq run``).

The product has no such hook: the wrapping happens here, before the CLI starts (a Celery worker's pool
children are forked from this process, so they build wrapped engines too).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from srd_worker.engines import registry


def _install() -> None:
    poison = os.environ.get("SRDQ_TEST_POISON") or None
    oom_above = int(os.environ["SRDQ_TEST_OOM_ABOVE"]) if os.environ.get("SRDQ_TEST_OOM_ABOVE") else None
    per_request = os.environ.get("SRDQ_TEST_PER_REQUEST") == "1"
    entry = registry.ENGINES["transformers"]

    def factory(model: str, settings: Any, engine_args: dict[str, Any]) -> Any:
        from tests.faults import FaultyEngine

        inner = entry.factory(model, settings, engine_args)
        return FaultyEngine(inner, poison=poison, oom_above=oom_above, per_request=per_request)

    registry.ENGINES["transformers"] = dataclasses.replace(entry, factory=factory)


_install()

if __name__ == "__main__":
    from srdq_cli.main import cli

    cli()
