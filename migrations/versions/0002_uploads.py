"""Upload tracking: shard.uploaded_at, run.manifest_at.

Revision ID: 0002
Revises: 0001
Create Date: 2025-12-02

A shard's parts and manifest are uploaded to the object store after its results are committed; a run's
manifest once every shard is done and uploaded. Both columns are NULL until then, so ``srdq sync`` and
the workers' reapers find what is still to upload. Written by hand to match ``srd_worker.store.models``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("shard", sa.Column("uploaded_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("run", sa.Column("manifest_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    # batch mode: SQLite rebuilds the table (older SQLite cannot drop a column); PostgreSQL alters it.
    with op.batch_alter_table("run") as batch:
        batch.drop_column("manifest_at")
    with op.batch_alter_table("shard") as batch:
        batch.drop_column("uploaded_at")
