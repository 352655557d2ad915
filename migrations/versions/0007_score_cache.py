"""The score cache: reward scores by content, shared by every run of the store.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

``score_cache`` maps the sha256 of (reward identity, question, response text, finished flag) to the
reward's score (``srd_worker.store.score_cache``), so a run that scores a response some earlier run (or
an earlier round) already scored with the same reward model reads the score instead of calling the
reward. A new table only: runs stored before the upgrade are read and resumed as they were (their
checkpointed ledgers lack the hit counters, which the step context adds when it first counts a hit).
Written by hand to match ``srd_worker.store.models``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "score_cache",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("reward", sa.String(length=64), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )


def downgrade() -> None:
    op.drop_table("score_cache")
