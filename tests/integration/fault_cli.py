"""``srdq`` with faults injected into its engine, for the isolation tests only:
``python -m tests.integration.fault_cli worker ...`` (or ``run ...``) is the real CLI, except that the
engine registry wraps every transformers engine it builds in ``tests.faults.FaultyEngine``, configured
from the environment:

- ``SRDQ_TEST_POISON``: a request whose prompt contains this text raises;
- ``SRDQ_TEST_OOM_ABOVE``: a batch of more requests than this raises ``torch.OutOfMemoryError``.

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
    entry = registry.ENGINES["transformers"]

    def factory(model: str, settings: Any) -> Any:
        from tests.faults import FaultyEngine

        return FaultyEngine(entry.factory(model, settings), poison=poison, oom_above=oom_above)

    registry.ENGINES["transformers"] = dataclasses.replace(entry, factory=factory)


_install()

if __name__ == "__main__":
    from srdq_cli.main import cli

    cli()
