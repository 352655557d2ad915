"""Read back a W&B offline run's transaction log (``run-<id>.wandb``) with wandb's own protobuf records.

The file is wandb's LevelDB-style log: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then 32 KiB
blocks of records, each a 7-byte header (crc32c, length, type: 1 full, 2 first, 3 middle, 4 last) and its
bytes; a block's last < 7 bytes are padding. Each assembled record is a ``wandb_internal_pb2.Record``.
(wandb's Python reader of this file left the package when its core moved to Go; the format is the same.)
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32 * 1024


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:7] == HEADER, data[:7]
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0:  # zero padding at the end of the file
            break
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(pending + chunk if kind == 4 else chunk)
            pending = b""
            yield rec
        else:
            pending = (pending if kind == 3 else b"") + chunk


def _items(items: Any) -> dict[str, Any]:
    return {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in items}


def read_run(path: Path) -> dict[str, Any]:
    """``run`` (id, project, name), ``config``, ``history`` (one dict per logged step, ``_step`` included)
    and ``summary`` (the last value of each summary key) of one offline run file."""
    out: dict[str, Any] = {"run": {}, "config": {}, "history": [], "summary": {}}
    for rec in records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["run"] = {"id": rec.run.run_id, "project": rec.run.project, "name": rec.run.display_name}
            out["config"].update(_items(rec.run.config.update))
        elif kind == "config":
            out["config"].update(_items(rec.config.update))
        elif kind == "history":
            out["history"].append(_items(rec.history.item))
        elif kind == "summary":
            out["summary"].update(_items(rec.summary.update))
    return out
