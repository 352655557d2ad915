"""Initial schema: run, shard, item, checkpoint, result.

Revision ID: 0001
Revises:
Create Date: 2025-11-30

Written by hand to match ``srd_worker.store.models`` exactly (a test compares the migrated database with
the models).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUS_CHECK = "status IN ('pending', 'running', 'done', 'failed', 'cancelled')"


def upgrade() -> None:
    op.create_table(
        "run",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("config_hash", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("n_items", sa.Integer(), nullable=False),
        sa.Column("n_shards", sa.Integer(), nullable=False),
        sa.Column("versions", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.CheckConstraint(STATUS_CHECK, name="ck_run_status"),
    )

    op.create_table(
        "shard",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("start", sa.Integer(), nullable=False),
        sa.Column("stop", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("lease_owner", sa.String(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], ondelete="CASCADE"),
        sa.UniqueConstraint("run_id", "index", name="uq_shard_run_id_index"),
        sa.CheckConstraint(STATUS_CHECK, name="ck_shard_status"),
    )
    op.create_index("ix_shard_run_id", "shard", ["run_id"])

    op.create_table(
        "item",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("shard_index", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("item_key", sa.String(), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("gold", sa.Text(), nullable=False),
        sa.Column("meta", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], ondelete="CASCADE"),
        sa.UniqueConstraint("run_id", "item_key", name="uq_item_run_id_item_key"),
        sa.UniqueConstraint("run_id", "position", name="uq_item_run_id_position"),
    )
    op.create_index("ix_item_run_id", "item", ["run_id"])

    op.create_table(
        "checkpoint",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("item_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("shard_index", sa.Integer(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.ForeignKeyConstraint(["item_id"], ["item.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], ondelete="CASCADE"),
        sa.UniqueConstraint("item_id", name="uq_checkpoint_item_id"),
    )
    op.create_index("ix_checkpoint_run_id_shard_index", "checkpoint", ["run_id", "shard_index"])

    op.create_table(
        "result",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("item_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("shard_index", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("record", sa.JSON(), nullable=False),
        sa.Column("correct", sa.Boolean(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.ForeignKeyConstraint(["item_id"], ["item.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], ondelete="CASCADE"),
        sa.UniqueConstraint("item_id", name="uq_result_item_id"),
    )
    op.create_index("ix_result_run_id", "result", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_result_run_id", table_name="result")
    op.drop_table("result")
    op.drop_index("ix_checkpoint_run_id_shard_index", table_name="checkpoint")
    op.drop_table("checkpoint")
    op.drop_index("ix_item_run_id", table_name="item")
    op.drop_table("item")
    op.drop_index("ix_shard_run_id", table_name="shard")
    op.drop_table("shard")
    op.drop_table("run")
