"""checkpoint_round: the state of every item after every round, the snapshots `srdq fork` starts from.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04

``checkpoint`` keeps only an item's latest state (upserted every round), so a run could not be restarted
from an earlier round. ``crud.save_checkpoints`` now also inserts the state into ``checkpoint_round``
(one row per item per round it was stepped in, zlib-compressed JSON, rounds up to
``SRDQ_SNAPSHOT_ROUNDS``), in the same transaction; ``srdq fork RUN --at-round R`` copies the latest row
with ``round <= R`` of every item into the forked run. Runs stored before the upgrade have no rows: they
can be forked only at a round by which every item had finished (their latest checkpoint). Written by hand
to match ``srd_worker.store.models``. (Numbered 0008: 0007 is being written on another branch; the lead
re-chains ``down_revision`` when both land.)
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "checkpoint_round",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("item_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("shard_index", sa.Integer(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("state_z", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.ForeignKeyConstraint(["item_id"], ["item.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], ondelete="CASCADE"),
        sa.UniqueConstraint("item_id", "round", name="uq_checkpoint_round_item_id_round"),
    )
    op.create_index("ix_checkpoint_round_run_id_shard_index", "checkpoint_round", ["run_id", "shard_index"])


def downgrade() -> None:
    op.drop_index("ix_checkpoint_round_run_id_shard_index", table_name="checkpoint_round")
    op.drop_table("checkpoint_round")
