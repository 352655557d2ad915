"""checkpoint.gen_tokens (the generated-token count of a state, apart from its JSON) and run.queue.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02

``srdq status`` summed ``checkpoint.state #>> '{ledger, gen_tokens}'`` over the unfinished items; on
PostgreSQL that reads the state's JSON, and a state whose generated text holds a NUL character (small
models emit them) fails with "\\u0000 cannot be converted to text". ``crud.save_checkpoints`` now writes
the count into this column with the state, and status sums the column, so no SQL path reads model text
to count tokens. The upgrade fills the column for the checkpoints status counts (items without a
result), reading their states in Python, which takes any text (reading them in SQL is what fails);
finished items' checkpoints keep 0, which nothing reads. Written by hand to match
``srd_worker.store.models``.

``run.queue`` records the broker queue a run was submitted to, so a worker's reaper re-enqueues only the
shards of its own queue's runs (it used to move every run's stale shards onto its own queue). Runs stored
before the upgrade have none and are reaped by every reaper, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    import json

    from srd_worker.store.crud import record_gen_tokens

    op.add_column("checkpoint", sa.Column("gen_tokens", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("run", sa.Column("queue", sa.String(), nullable=True))
    conn = op.get_bind()
    unfinished = conn.execute(
        sa.text(
            "SELECT c.id, c.state FROM checkpoint c "
            "WHERE NOT EXISTS (SELECT 1 FROM result r WHERE r.item_id = c.item_id)"
        )
    ).all()
    counts = []
    for row_id, state in unfinished:
        parsed = json.loads(state) if isinstance(state, str | bytes) else state
        counts.append({"i": row_id, "n": record_gen_tokens(parsed)})
    if counts:
        conn.execute(sa.text("UPDATE checkpoint SET gen_tokens = :n WHERE id = :i"), counts)


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite >= 3.35 has it): batch mode would rebuild ``run``, and dropping the old
    # table cascades to every shard, item and result that references it.
    op.drop_column("checkpoint", "gen_tokens")
    op.drop_column("run", "queue")
