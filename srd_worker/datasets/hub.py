"""Hugging Face Hub datasets that are already in the local cache, named by their id: never a download.

``hf:OWNER/NAME[/CONFIG][:SPLIT]`` (or a bare ``OWNER/NAME[:SPLIT]`` that is not an existing path) is
looked up with ``huggingface_hub.snapshot_download(..., repo_type="dataset", local_files_only=True)``
in the hub cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``, read when
called). In the cached snapshot, the data files (Parquet, JSON Lines, CSV, ``.jsonl.gz``) are grouped by
split: a file ``test-00000-of-00001.parquet`` or ``test.jsonl`` is split ``test``, and so is any file in
a folder named ``test``; ``CONFIG`` keeps only the files under that folder (``hf:openai/gsm8k/main:test``).
Without ``:SPLIT`` the only split is taken, else ``test``, else the error lists them.

Left out: splits spread over several files (the error names them: pass one file's path), loading scripts,
and ``datasets``' own Arrow cache (``~/.cache/huggingface/datasets``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from srd_worker.errors import DatasetError

PREFIX: str = "hf:"
_ID_RE = re.compile(
    r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?P<config>(?:/[\w.-]+)*)(?::(?P<split>[\w.-]+))?$"
)
_DATA_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".json", ".ndjson", ".csv", ".csv.gz")
_SPLIT_RE = re.compile(r"^(?P<split>[A-Za-z][\w]*?)(?:[-_.]\d+(?:-of-\d+)?)*$")


def hub_cache_dir() -> Path:
    """The hub cache folder, from the environment as it is now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "huggingface" / "hub"


def parse_hub_id(value: str) -> tuple[str, str, str | None] | None:
    """``(repo_id, config folder, split)`` of a hub dataset name, or None when ``value`` is not one (a bare
    name needs exactly OWNER/NAME[:SPLIT])."""
    prefixed = value.startswith(PREFIX)
    m = _ID_RE.match(value[len(PREFIX) :] if prefixed else value)
    if m is None or (not prefixed and m.group("config")):
        return None
    return m.group("repo"), m.group("config").strip("/"), m.group("split")


def _split_of(rel: Path) -> str | None:
    name = rel.name
    for suffix in _DATA_SUFFIXES:
        if name.lower().endswith(suffix):
            stem = name[: -len(suffix)]
            break
    else:
        return None
    for part in rel.parts[:-1]:
        if part in ("train", "test", "validation", "dev", "valid"):
            return part
    m = _SPLIT_RE.match(stem)
    return m.group("split") if m else stem


def resolve_hub_dataset(value: str) -> Path:
    """The one cached data file of ``value``'s split; ``DatasetError`` naming the id when it is not in the
    local cache, has no such split or config, or the split is several files."""
    parsed = parse_hub_id(value)
    if parsed is None:
        raise DatasetError("not a Hugging Face dataset id (hf:OWNER/NAME[/CONFIG][:SPLIT])", path=value)
    repo, config, split = parsed
    cache = hub_cache_dir()
    try:
        from huggingface_hub import snapshot_download

        root = Path(
            str(snapshot_download(repo, repo_type="dataset", cache_dir=str(cache), local_files_only=True))
        )
    except Exception as exc:  # noqa: BLE001 - LocalEntryNotFoundError and friends: not in the cache
        raise DatasetError(
            f"Hugging Face dataset {repo!r} is not in the local cache ({cache}); srdq never downloads: fetch it "
            f"first (hf download --repo-type dataset {repo}) or set HF_HUB_CACHE / HF_HOME",
            path=value,
        ) from exc
    base = root / config if config else root
    if config and not base.is_dir():
        raise DatasetError(
            f"dataset {repo!r} has no config folder {config!r} in its cached snapshot", path=value
        )
    splits: dict[str, list[Path]] = {}
    for file in sorted(p for p in base.rglob("*") if p.is_file()):
        found = _split_of(file.relative_to(base))
        if found is not None:
            splits.setdefault(found, []).append(file)
    if not splits:
        raise DatasetError(
            f"the cached snapshot of {repo!r} holds no Parquet, JSON Lines or CSV file", path=value
        )
    if split is None:
        split = next(iter(splits)) if len(splits) == 1 else "test" if "test" in splits else None
        if split is None:
            raise DatasetError(f"name a split: {', '.join(f'{value}:{s}' for s in splits)}", path=value)
    files = splits.get(split)
    if not files:
        raise DatasetError(f"no split {split!r} (splits: {', '.join(splits)})", path=value)
    if len(files) > 1:
        shown = ", ".join(str(f.relative_to(root)) for f in files[:4])
        raise DatasetError(
            f"split {split!r} is {len(files)} files ({shown}); srdq reads one file per split: name a config "
            f"(hf:{repo}/CONFIG:{split}) or pass one file's path",
            path=value,
        )
    return files[0]
