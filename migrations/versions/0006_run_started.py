"""run.started_at: when work on a run (re)started, the origin of `srdq status`'s rate and ETA.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03

``srdq status`` measured a run's speed from ``run.created_at``, so the time its shards waited in the
queue before any worker took one counted as work, and the ETA of a run submitted behind others was far too
long. ``leases.acquire`` now sets ``started_at`` when it leases a shard of a run that has none (the first
lease after a submit, or after ``srdq resume`` cleared it); the embedded ``srdq run`` sets it when a call
starts. Runs stored before the upgrade keep NULL and are measured from ``created_at`` as before. Written by
hand to match ``srd_worker.store.models``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("run", sa.Column("started_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite >= 3.35 has it): batch mode would rebuild ``run``, and dropping the old
    # table cascades to every shard, item and result that references it (as in 0005).
    op.drop_column("run", "started_at")
