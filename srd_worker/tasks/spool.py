"""Validated dataset items spooled to a temporary SQLite file: how ``srdq submit dataset`` takes a
dataset of any length in memory that does not grow with it.

``spool_items`` streams the file once through the task's own row validation (``Rows.iter_items``), in
file order, and writes each item to a throw-away SQLite database (Python's ``sqlite3``, no durability:
it is deleted afterwards) in batches. Ids are checked for duplicates there, through a primary key,
instead of a dict in memory; a duplicate is reported as ``Rows.check_unique_ids`` reports it (naming
both lines) but only after every row was validated, so the first bad row still wins as it did when the
file was read whole. ``--limit K`` keeps the first K items; every row of the file is still validated.

The spool then hands the items back in dataset order, a batch at a time: as ``Item``s (``__iter__``)
or as rows ready for the store (``batches``, the meta already JSON-encoded for a bulk insert).

Bad input the store could not hold is refused here, naming the line: a NUL character in the id,
question or gold answer (PostgreSQL text cannot contain one).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from srd_worker.errors import DatasetError
from srd_worker.tasks.base import Item
from srd_worker.tasks.loading import DEFAULT_MAX_ROW_BYTES, dataset_error, read_rows

#: Rows validated per SQLite transaction, and rows per batch handed back.
BATCH_ROWS = 5000

#: (position, item_key, question, gold, meta as JSON text): one item as the store's bulk insert takes it.
SpoolRow = tuple[int, str, str, str, str]


class ItemSpool:
    """Items validated by ``spool_items``, held on disk. ``len()`` is the number of items kept; iterating
    streams them as ``Item``s in dataset order. Close it (or use it as a context manager) to delete the
    file; it is also deleted when the object is collected."""

    #: ``store.crud.create_run`` skips its in-memory duplicate check: ids were checked here.
    ids_unique = True

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="srdq-spool-")
        self._finalizer = weakref.finalize(self, shutil.rmtree, self._dir, True)
        self.path = Path(self._dir) / "items.sqlite"
        self._db = sqlite3.connect(self.path)
        self._db.executescript(
            """
            PRAGMA journal_mode=OFF;
            PRAGMA synchronous=OFF;
            CREATE TABLE ids (key TEXT PRIMARY KEY, at INTEGER NOT NULL) WITHOUT ROWID;
            CREATE TABLE items (
                position INTEGER PRIMARY KEY, key TEXT NOT NULL, question TEXT NOT NULL,
                gold TEXT NOT NULL, meta TEXT NOT NULL
            );
            """
        )
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def batches(self, size: int = BATCH_ROWS) -> Iterator[list[SpoolRow]]:
        """The kept items in dataset order, ``size`` at a time."""
        cursor = self._db.execute("SELECT position, key, question, gold, meta FROM items ORDER BY position")
        try:
            while rows := cursor.fetchmany(size):
                yield rows
        finally:
            cursor.close()

    def __iter__(self) -> Iterator[Item]:
        for batch in self.batches():
            for _pos, key, question, gold, meta in batch:
                yield Item(id=key, question=question, gold=gold, meta=json.loads(meta))

    def close(self) -> None:
        self._db.close()
        self._finalizer()

    def __enter__(self) -> ItemSpool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ filling
    def _add(self, batch: list[tuple[int, Item]], limit: int | None) -> tuple[int, str] | None:
        """Store one batch of (at, item); return the first (at, id) whose id was seen before, if any."""
        before = self._db.total_changes
        self._db.executemany(
            "INSERT OR IGNORE INTO ids (key, at) VALUES (?, ?)", [(item.id, at) for at, item in batch]
        )
        duplicate = None
        if self._db.total_changes - before < len(batch):  # some id was there already: find the first
            for at, item in batch:
                (first,) = self._db.execute("SELECT at FROM ids WHERE key = ?", (item.id,)).fetchone()
                if first != at:
                    duplicate = (at, item.id)
                    break
        keep = batch if limit is None else batch[: max(0, limit - self._n)]
        self._db.executemany(
            "INSERT INTO items (position, key, question, gold, meta) VALUES (?, ?, ?, ?, ?)",
            [
                (self._n + i, item.id, item.question, item.gold, json.dumps(item.meta))
                for i, (_at, item) in enumerate(keep)
            ],
        )
        self._n += len(keep)
        self._db.commit()
        return duplicate


def _rows_of(task: Any, path: str | Path, max_row_bytes: int) -> tuple[str, Iterator[tuple[int, Item]]]:
    """(unit, stream of (at, item)): the task's own per-row validation over a streamed file. A task without
    the ``_item(rows, at, row)`` hook every built-in task has is loaded whole by its ``load``."""
    make_item = getattr(task, "_item", None)
    if callable(make_item):
        rows = read_rows(path, max_row_bytes=max_row_bytes, stream=True)
        return rows.unit, rows.iter_items(make_item)
    return "line", ((i, item) for i, item in enumerate(task.load(path), start=1))


def spool_items(
    task: Any,
    path: str | Path,
    *,
    limit: int | None = None,
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
    batch_rows: int = BATCH_ROWS,
) -> ItemSpool:
    """Validate every row of ``path`` with ``task`` and spool the items (the first ``limit`` if given).

    Raises ``DatasetError`` naming the file, line (or Parquet row) and field for the first bad row, or
    both lines of the first duplicate id once every row is valid; the spool is deleted on error."""
    spool = ItemSpool()
    try:
        unit, stream = _rows_of(task, path, max_row_bytes)
        duplicate: tuple[int, str] | None = None
        batch: list[tuple[int, Item]] = []
        for at, item in stream:
            for name, value in (("id", item.id), ("question", item.question), ("gold", item.gold)):
                if "\x00" in value:
                    raise dataset_error(
                        f"the item's {name} contains a NUL character, which the store cannot hold",
                        path=path,
                        at=at,
                        unit=unit,
                    )
            batch.append((at, item))
            if len(batch) >= batch_rows:
                found = spool._add(batch, limit)
                duplicate = duplicate or found
                batch = []
        if batch:
            found = spool._add(batch, limit)
            duplicate = duplicate or found
        if duplicate is not None:
            at, key = duplicate
            (first,) = spool._db.execute("SELECT at FROM ids WHERE key = ?", (key,)).fetchone()
            raise dataset_error(
                f"duplicate id {key!r} (first used on {unit} {first})", path=path, at=at, unit=unit
            )
        if not len(spool):
            raise DatasetError("no rows to run", path=str(path))
    except BaseException:
        spool.close()
        raise
    return spool
