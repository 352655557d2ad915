"""Snapshots of a benchmark's SQLite store that a git repository can carry cheaply.

A long grid (``benchmarks/real_text.py``) goes on across machines from a copy of its store committed to the
repository. One gzipped file for the whole store meant every save added the whole store to git's history
again (34 MB a save for the real-text grid), although a finished run never changes. A snapshot is
therefore a folder of small SQLite files, each holding the store's whole schema and a part of its rows:

- ``run-<id>.db.gz``: the rows of one run (the ``run`` row and every row whose ``run_id`` is it);
- ``common-<table>-<k>.db.gz``: the rows of a table that belongs to no run (the score cache, sweeps, the
  schema version) whose rowid falls in block ``k`` (``BLOCK`` rows a block), so rows added later land in
  that table's last block and every other file keeps its bytes.

The files are written deterministically (rows in rowid order into a fresh file, gzip without a time
stamp) and a file whose bytes would not change is not rewritten, so a save after one more run touches that
run's file, the last score-cache block and the sweeps' file only. ``restore`` puts the rows back with their rowids, so a
store restored and saved again gives the same files.
"""

from __future__ import annotations

import gzip
import re
import sqlite3
import tempfile
from pathlib import Path

BLOCK = 20_000  # rows of a run-less table per common-<table>-<k> file
_SAFE = re.compile(r"[^A-Za-z0-9._-]")
# the statements that rebuild the schema: tables first, then their indexes (SQLite's own entries left out)
_SCHEMA = (
    "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' "
    "ORDER BY CASE type WHEN 'table' THEN 0 ELSE 1 END, rowid"
)


def is_snapshot(folder: Path) -> bool:
    """Whether ``folder`` holds a snapshot written by ``save``."""
    return folder.is_dir() and any(folder.glob("common-*.db.gz"))


def _tables(con: sqlite3.Connection, schema: str = "main") -> dict[str, list[str]]:
    rows = con.execute(
        f"SELECT name FROM {schema}.sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
        "ORDER BY rowid"
    ).fetchall()
    return {name: [c[1] for c in con.execute(f'PRAGMA {schema}.table_info("{name}")')] for (name,) in rows}


def _run_key(table: str, columns: list[str]) -> str | None:
    """The column that names a row's run, or None for a table that belongs to no run."""
    if table == "run" and "id" in columns:
        return "id"
    return "run_id" if "run_id" in columns else None


def _write(path: Path, schema_sql: list[str], parts: dict[str, tuple[list[str], list[tuple]]]) -> bool:
    """Write one snapshot file (``parts``: table -> (columns, rows with the rowid first)); False when the
    file already holds exactly these bytes and is left untouched."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "part.db"
        con = sqlite3.connect(db)
        try:
            for sql in schema_sql:
                con.execute(sql)
            for table, (columns, rows) in parts.items():
                cols = ", ".join(["rowid", *(f'"{c}"' for c in columns)])
                marks = ", ".join("?" * (len(columns) + 1))
                con.executemany(f'INSERT INTO "{table}" ({cols}) VALUES ({marks})', rows)
            con.commit()
        finally:
            con.close()
        data = gzip.compress(db.read_bytes(), mtime=0)
    if path.is_file() and path.read_bytes() == data:
        return False
    part = path.with_name(path.name + ".part")
    part.write_bytes(data)
    part.replace(path)
    return True


def save(db: Path, folder: Path) -> dict[str, int]:
    """Snapshot the SQLite store ``db`` into ``folder`` (read in one transaction, so a run writing to the
    store meanwhile is safe: it waits or, under WAL, goes on beside it). Files of runs no longer in the
    store are removed. Returns counts: files written, unchanged and removed."""
    folder.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=60)
    written = unchanged = 0
    keep: set[str] = set()
    try:
        con.execute("BEGIN")  # one read snapshot for every query below
        schema_sql = [sql for (sql,) in con.execute(_SCHEMA)]
        tables = _tables(con)
        by_run = {t: k for t, c in tables.items() if (k := _run_key(t, c))}
        run_ids = (
            [r for (r,) in con.execute('SELECT id FROM "run" ORDER BY rowid')] if "run" in by_run else []
        )

        def rows(table: str, where: str, args: tuple) -> tuple[list[str], list[tuple]]:
            cols = tables[table]
            sel = ", ".join(["rowid", *(f'"{c}"' for c in cols)])
            return cols, con.execute(
                f'SELECT {sel} FROM "{table}" WHERE {where} ORDER BY rowid', args
            ).fetchall()

        for run_id in run_ids:
            name = f"run-{_SAFE.sub('_', str(run_id).removeprefix('run-'))}.db.gz"
            parts = {t: rows(t, f'"{k}" = ?', (run_id,)) for t, k in by_run.items()}
            keep.add(name)
            if _write(folder / name, schema_sql, parts):
                written += 1
            else:
                unchanged += 1
        for table in (t for t in tables if t not in by_run):  # each run-less table in its own blocks
            top = con.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()[0] or 0
            for block in range(max(1, -(-top // BLOCK))):
                name = f"common-{_SAFE.sub('_', table)}-{block}.db.gz"
                parts = {table: rows(table, "rowid > ? AND rowid <= ?", (block * BLOCK, (block + 1) * BLOCK))}
                keep.add(name)
                if _write(folder / name, schema_sql, parts):
                    written += 1
                else:
                    unchanged += 1
        con.execute("COMMIT")
    finally:
        con.close()
    stale = [p for p in folder.glob("*.db.gz") if p.name not in keep]
    for p in stale:
        p.unlink()
    return {"written": written, "unchanged": unchanged, "removed": len(stale)}


def restore(folder: Path, db: Path) -> int:
    """Rebuild a store at ``db`` (which must not exist) from the snapshot in ``folder``: the schema, then
    every file's rows with their rowids. Written beside ``db`` and moved into place, so an interrupted
    restore leaves no half store. Returns the number of files read."""
    files = sorted(folder.glob("common-*.db.gz")) + sorted(folder.glob("run-*.db.gz"))
    if not is_snapshot(folder):
        raise FileNotFoundError(f"{folder}: no snapshot (no common-*.db.gz)")
    if db.exists():
        raise FileExistsError(f"{db}: a store is already there")
    db.parent.mkdir(parents=True, exist_ok=True)
    part = db.with_name(db.name + ".part")
    part.unlink(missing_ok=True)
    con = sqlite3.connect(part)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i, src in enumerate(files):
                unpacked = Path(tmp) / f"{i}.db"
                unpacked.write_bytes(gzip.decompress(src.read_bytes()))
                if i == 0:
                    first = sqlite3.connect(unpacked)
                    try:
                        schema_sql = [sql for (sql,) in first.execute(_SCHEMA)]
                    finally:
                        first.close()
                    for sql in schema_sql:
                        con.execute(sql)
                con.execute("ATTACH DATABASE ? AS src", (str(unpacked),))
                for table, columns in _tables(con, "src").items():
                    cols = ", ".join(["rowid", *(f'"{c}"' for c in columns)])
                    con.execute(f'INSERT INTO main."{table}" ({cols}) SELECT {cols} FROM src."{table}"')
                con.commit()
                con.execute("DETACH DATABASE src")
                unpacked.unlink()
    finally:
        con.close()
    part.replace(db)
    return len(files)
