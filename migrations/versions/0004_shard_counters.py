"""Shard counters for status at scale: shard.n_done, n_failed, gen_tokens and an index on (run_id, status).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

``srdq status`` used to read every result record (and every checkpoint state) of a run to count items
and tokens; on a run of a million items that is seconds of reading. ``crud.save_results`` now adds each
shard's results to these counters in the transaction that inserts them, and status sums the shard rows
(grouped by state through the new index). The upgrade fills the counters from the results already
stored. Written by hand to match ``srd_worker.store.models``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COUNTERS = ("n_done", "n_failed", "gen_tokens")


def upgrade() -> None:
    for name in COUNTERS:
        op.add_column("shard", sa.Column(name, sa.Integer(), nullable=False, server_default="0"))
    op.create_index("ix_shard_run_id_status", "shard", ["run_id", "status"])
    # Backfill from the stored results (correlated subqueries: portable across PostgreSQL and SQLite).
    shard = sa.table(
        "shard", sa.column("run_id"), sa.column("index"), *(sa.column(n, sa.Integer) for n in COUNTERS)
    )
    result = sa.table(
        "result",
        sa.column("run_id"),
        sa.column("shard_index"),
        sa.column("error"),
        sa.column("record", sa.JSON),
    )
    mine = sa.and_(result.c.run_id == shard.c.run_id, result.c.shard_index == shard.c.index)
    tokens = result.c.record[("ledger", "gen_tokens")].as_integer()
    has_results = sa.exists().where(mine)
    op.execute(
        shard.update()
        .where(has_results)
        .values(
            n_done=sa.select(sa.func.count()).where(mine, result.c.error.is_(None)).scalar_subquery(),
            n_failed=sa.select(sa.func.count()).where(mine, result.c.error.is_not(None)).scalar_subquery(),
            gen_tokens=sa.select(sa.func.coalesce(sa.func.sum(tokens), 0)).where(mine).scalar_subquery(),
        )
    )


def downgrade() -> None:
    op.drop_index("ix_shard_run_id_status", table_name="shard")
    # batch mode: SQLite rebuilds the table (older SQLite cannot drop a column); PostgreSQL alters it.
    with op.batch_alter_table("shard") as batch:
        for name in COUNTERS:
            batch.drop_column(name)
