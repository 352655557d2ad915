"""A reasoning testbed that fits on a CPU: generated multi-step arithmetic word problems in the GSM8K layout
(``generator``), a character-level tokenizer with a ChatML template (``tokenizer``), and the build that trains
a small Llama policy, a smaller draft and an outcome reward model on them (``train``; ``srdq testbed build``).
The committed build lives in ``artifacts/`` with a ``manifest.json`` (sha256 of every file, configuration,
measured accuracies and reward-model AUROC).
"""

from pathlib import Path

from srd_worker.paths import TESTBED_ARTIFACTS_DIR

#: The committed build (data splits, policy, draft, rm, manifest.json; ``srd_worker.paths``).
ARTIFACTS_DIR: Path = TESTBED_ARTIFACTS_DIR
