"""run.started_tokens: the generated tokens a run held when work (re)started, so `srdq status`'s rate counts
only the tokens made since.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05

After ``srdq resume`` (or another call of the embedded ``srdq run``) the rate's clock restarts at
``run.started_at``, but until a shard finished ``srdq status`` divided *all* the run's tokens, those made in
earlier sessions included, by the time since that restart: a run resumed with 73k tokens in its
checkpoints showed 3,346 tok/s a minute in. ``leases.acquire`` and ``crud.set_run_status(started=True)``
now store the run's token count with ``started_at``, and status subtracts it. Runs stored before the upgrade
get 0 (as before, until their next start). Written by hand to match ``srd_worker.store.models``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("run", sa.Column("started_tokens", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    # A plain DROP COLUMN, as in 0006: batch mode would rebuild ``run`` and cascade to its shards.
    op.drop_column("run", "started_tokens")
