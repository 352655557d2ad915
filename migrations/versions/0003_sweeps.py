"""Sweeps: the sweep table and run.sweep_id.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

``srdq run --sweep`` and ``srdq submit dataset --sweep`` record the sweep file (canonical content, the
run ids it expands to) and tag each run they create with its sweep id (NULL for runs outside a sweep).
Written by hand to match ``srd_worker.store.models``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sweep",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("run_ids", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.add_column("run", sa.Column("sweep_id", sa.String(), nullable=True))
    op.create_index("ix_run_sweep_id", "run", ["sweep_id"])


def downgrade() -> None:
    op.drop_index("ix_run_sweep_id", table_name="run")
    # batch mode: SQLite rebuilds the table (older SQLite cannot drop a column); PostgreSQL alters it.
    with op.batch_alter_table("run") as batch:
        batch.drop_column("sweep_id")
    op.drop_table("sweep")
