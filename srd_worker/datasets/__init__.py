"""The reference datasets srdq ships with, and how a ``DATASET`` argument becomes a file.

Five JSON Lines files sit in ``data/`` next to this module, byte-identical to their public sources (see
``data/README.md`` for sources, commits and licences); they are package data, so a non-editable install
carries them and ``srdq run gsm8k`` needs no file at all. ``DATASETS`` describes each one: its name, the
task adapter that reads it (``tasks/registry.py``), record count, size, sha256, licence and source.

``resolve_dataset(name_or_path)`` follows lm-eval's rule that what the user has on disk wins:

1. an existing *file* at that path is used as is, even when its name is also a built-in name (a local
   ``gsm8k`` file shadows the built-in GSM8K);
2. otherwise a built-in name resolves to the packaged file; a *directory* with a built-in name (say an
   ``--out gsm8k`` folder) does not shadow it, since a directory is never a dataset;
3. otherwise an existing path (a directory: a Hugging Face ``save_to_disk`` folder, or one the reader
   refuses with its own message) is returned as is;
4. ``hf:OWNER/NAME[/CONFIG][:SPLIT]``, or a bare ``OWNER/NAME[:SPLIT]`` that is no existing path and has no
   file suffix, is a Hugging Face dataset already in the local hub cache (``datasets.hub``; never a
   download; not cached: an error naming the id);
5. a value that does not exist raises ``DatasetError``: ``FILE: file not found`` when it looks like a
   path (a separator or a suffix), else a message naming it and listing the built-in names.

Left out: downloading (srdq never fetches data), versions of a dataset, and GPQA Diamond, whose authors
distribute it only inside a password-protected archive.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from srd_worker.errors import DatasetError
from srd_worker.paths import DATASETS_DIR, TESTBED_ARTIFACTS_DIR

DATA_DIR: Path = DATASETS_DIR


@dataclass(frozen=True)
class BuiltinDataset:
    """One packaged dataset. ``task`` is a ``tasks.registry.TASKS`` name, or None for a file that is not a
    task (PRM800K step labels)."""

    name: str
    filename: str
    task: str | None
    records: int
    bytes: int
    sha256: str
    licence: str
    source: str  # repository, path and commit the bytes were taken from
    description: str

    @property
    def path(self) -> Path:
        return DATA_DIR / self.filename

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "path": str(self.path)}


#: In the order ``srdq datasets`` and error messages list them.
DATASETS: dict[str, BuiltinDataset] = {
    d.name: d
    for d in (
        BuiltinDataset(
            name="math500",
            filename="math500.jsonl",
            task="math500",
            records=500,
            bytes=446_564,
            sha256="35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
            licence="MIT",
            source="openai/prm800k prm800k/math_splits/test.jsonl @ 7ecc794703b2877f63226f2477a49b34f9b25163 "
            "(bytes from ZubinGou/math-evaluation-harness data/math_oai/test.jsonl "
            "@ db77bc6bb2a17c90ed2d63e88ebd8c40a82858c5)",
            description="MATH-500: the 500 MATH test problems of 'Let's Verify Step by Step'",
        ),
        BuiltinDataset(
            name="gsm8k",
            filename="gsm8k_test.jsonl",
            task="gsm8k",
            records=1319,
            bytes=749_738,
            sha256="3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
            licence="MIT",
            source="openai/grade-school-math grade_school_math/data/test.jsonl "
            "@ 3101c7d5072418e28b9008a6636bde82a006892c",
            description="GSM8K test set: grade-school math word problems, answers after '####'",
        ),
        BuiltinDataset(
            name="hotpotqa",
            filename="hotpotqa_dev_500.jsonl",
            task="hotpotqa",
            records=500,
            bytes=3_233_800,
            sha256="b5918b1a6e802caecae02bce7bb70d449197d0a5f10fb3653bda00eefffd255f",
            licence="CC BY-SA 4.0",
            source="xindili-cmu/anlp-project-multihop processed_data/hotpotqa/dev_subsampled.jsonl "
            "@ df0d5757f42f098ab6026f40323e91c369307506 (type, dev_index from ysymyth/ReAct "
            "data/hotpot_dev_v1_simplified.json @ 6bdb3a1fd38b8188fc7ba4102969fe483df8fdc9)",
            description="HotpotQA dev (distractor): first 250 bridge + 250 comparison questions, "
            "with their passages",
        ),
        BuiltinDataset(
            name="alpaca_eval",
            filename="alpaca_eval.jsonl",
            task="alpaca_eval",
            records=805,
            bytes=2_175_976,
            sha256="7ce944e36d1734e523d8a24bf871c100e60701aa6f70d2a927198c57da8220a0",
            licence="CC BY-NC 4.0",
            source="tatsu-lab/alpaca_eval example/outputs.json, results/{gpt4_1106_preview,"
            "text_davinci_003}/model_outputs.json @ cd543a149df89434d8a54582c0151c0b945c3d20",
            description="AlpacaEval: 805 instructions with two reference models' outputs (no gold answer)",
        ),
        BuiltinDataset(
            name="prm800k_sample",
            filename="prm800k_phase_labels_sample.jsonl",
            task=None,
            records=6,
            bytes=18_619,
            sha256="8c0b7b5034eb9da5bb8bb82b4a064732951b3257957c4453849ff32f592a94fe",
            licence="MIT",
            source="openreasoner/openr preprocess/tests/samples_prm800k.jsonl "
            "@ 54ae004c69623ebb9a97b22211d6b236033a710d",
            description="PRM800K step labels, not a task: 6 solutions with human per-step ratings, for "
            "reward-model checks",
        ),
    )
}

#: Datasets srdq generates and commits itself rather than ships from a public source: name -> (file,
#: description). ``testbed`` is the CPU testbed's test split (``srd_worker/testbed``, ``srdq testbed build``);
#: its sha256 is in the testbed's ``manifest.json``. A run records it by name with the file's sha256, like
#: any file; an existing file of the same name wins, as for the packaged ones.
GENERATED: dict[str, tuple[Path, str]] = {
    "testbed": (
        TESTBED_ARTIFACTS_DIR / "data" / "test.jsonl",
        "the CPU testbed's test split: generated multi-step arithmetic word problems (GSM8K layout)",
    ),
}


def dataset_name(value: str | Path) -> str:
    """The name a report gives the dataset a run was given as ``value``: a built-in or generated name as
    is, a path to one of their files by that name, any other file by its stem. Reads no file."""
    text = str(value)
    if text in DATASETS or text in GENERATED:
        return text
    path = Path(text)
    try:
        resolved = path.resolve()
    except OSError:
        resolved = path
    for name, entry in DATASETS.items():
        if resolved == entry.path.resolve():
            return name
    for name, (generated, _) in GENERATED.items():
        if resolved == generated.resolve():
            return name
    return path.stem or text


def names() -> str:
    """The built-in names, comma-separated, for messages."""
    return ", ".join(DATASETS)


def builtin_dataset(name_or_path: str | Path) -> BuiltinDataset | None:
    """The built-in dataset ``name_or_path`` resolves to, or None when it is an existing file (which wins)
    or not a built-in name."""
    value = str(name_or_path)
    if Path(value).is_file():
        return None
    return DATASETS.get(value)


def resolve_dataset(name_or_path: str | Path) -> Path:
    """The file to read for ``name_or_path``: an existing file, else a built-in dataset's packaged file.

    Another existing path (a directory) that is not a built-in name is returned as is, so the dataset
    reader reports why it cannot be read. Raises ``DatasetError`` when the value is neither (``file not
    found`` for a path, the list of built-in names for a bare name), or when a built-in dataset's file is
    missing from the installation.
    """
    from srd_worker.datasets.hub import PREFIX, parse_hub_id, resolve_hub_dataset

    value = str(name_or_path)
    path = Path(value)
    if value.startswith(PREFIX) and not path.exists():
        return resolve_hub_dataset(value)
    if value in GENERATED and not path.is_file():
        generated = GENERATED[value][0]
        if not generated.is_file():
            raise DatasetError(
                f"dataset {value!r} is missing from this installation (run `srdq testbed build`)",
                path=str(generated),
            )
        return generated
    entry = DATASETS.get(value)
    if path.is_file() or (path.exists() and entry is None):
        return path  # a directory that is not a built-in name: the reader says why it cannot be used
    if entry is None:
        if not path.suffix and parse_hub_id(value) is not None:
            return resolve_hub_dataset(value)  # OWNER/NAME: a hub dataset in the local cache
        if "/" in value or "\\" in value or path.suffix:
            raise DatasetError("file not found", path=value)  # clearly a path: the reader's own message
        raise DatasetError(
            "not a built-in dataset name, and no such file "
            f"(built-in datasets: {names()}; see `srdq datasets`)",
            path=value,
        )
    if not entry.path.is_file():
        raise DatasetError(
            f"built-in dataset {entry.name!r} is missing from this installation (reinstall srdq)",
            path=str(entry.path),
        )
    return entry.path
