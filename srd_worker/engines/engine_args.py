"""Engine arguments: ``--engine-arg KEY=VALUE`` (``srdq run``, ``srdq submit dataset``) and a sweep file's
``engine_args:`` mapping, passed through to the engine's constructor.

- transformers: ``from_pretrained`` keyword arguments from an allow-list (``TRANSFORMERS_ARGS``: revision,
  trust_remote_code, attn_implementation, dtype / its alias torch_dtype, subfolder, use_safetensors) and
  the engine's own ``max_batch_size``;
- vllm: any field of vLLM's ``EngineArgs`` dataclass (what ``vllm.LLM(**kwargs)`` takes: max_model_len,
  quantization, kv_cache_dtype, revision, trust_remote_code, tensor_parallel_size, data_parallel_size,
  ...), found by introspecting the installed vLLM when the arguments are checked (never at import). Where
  vLLM is not installed (a light machine submitting to GPU workers) the keys cannot be checked here: they
  are accepted with a warning, and each worker checks them again before it builds its engine;
- openai: ``api`` (``completions``, the default, or ``chat``: ``/v1/chat/completions``, see
  ``openai_engine``), ``continue_final_message`` (bool, default true: how the chat API continues a
  partial answer), ``body.FIELD`` (an extra field of every request's JSON body, e.g. ``body.min_p=0.05``)
  and ``header.NAME`` (an extra HTTP header).

A value is read as a YAML scalar (``1024`` int, ``0.5`` float, ``true`` bool, ``null``, anything else
text); where an argument takes text, the text is kept as given (``revision=1234`` stays ``"1234"``).
Lists and mappings are refused: srdq passes scalars only. Each key is checked against the engine's
accepted arguments and each value against the argument's type before anything is written: an unknown key
is refused naming it, with the closest accepted names (difflib). Engine arguments win over the SRDQ_*
settings of the same meaning (``dtype``, ``tensor_parallel_size``); they enter the run id and the run's
provenance (they can change results).
"""

from __future__ import annotations

import difflib
import enum
import logging
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from srd_worker.errors import ConfigError

log = logging.getLogger("srdq.engine_args")

Scalar = str | int | float | bool | None


@dataclass(frozen=True)
class Arg:
    """One accepted argument: the Python type its value must have (``typing`` forms allowed) and a line
    of help."""

    type: Any
    help: str = ""


ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
DTYPES = ("auto", "bfloat16", "float16", "float32")

#: The transformers engine's arguments: ``from_pretrained`` keywords, and ``max_batch_size`` (the engine's).
TRANSFORMERS_ARGS: dict[str, Arg] = {
    "revision": Arg(str, "the model's revision (branch, tag or commit) in the local Hugging Face cache"),
    "trust_remote_code": Arg(bool, "run the model repository's own modelling code"),
    "attn_implementation": Arg(typing.Literal[ATTN_IMPLEMENTATIONS], "attention kernels"),
    "dtype": Arg(typing.Literal[DTYPES], "model dtype (wins over SRDQ_DTYPE)"),
    "subfolder": Arg(str, "the model's subfolder inside the repository or folder"),
    "use_safetensors": Arg(bool, "load only safetensors weights"),
    "max_batch_size": Arg(int, "requests per padded forward pass (default 64)"),
}
#: Aliases, renamed before checking (the run id names the canonical key).
TRANSFORMERS_ALIASES = {"torch_dtype": "dtype"}

OPENAI_APIS = ("completions", "chat")
OPENAI_ARGS: dict[str, Arg] = {
    "api": Arg(typing.Literal[OPENAI_APIS], "completions (default: prefix continuation) or chat"),
    "continue_final_message": Arg(
        bool, "api=chat: continue a partial answer with vLLM's continue_final_message (default true)"
    ),
}
#: Request fields the openai engine sets itself (``body.FIELD`` may not override them).
OPENAI_OWN_FIELDS = frozenset(
    {
        "model",
        "prompt",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "n",
        "stream",
        "seed",
        "stop",
        "stop_token_ids",
        "logprobs",
        "top_logprobs",
        "prompt_logprobs",
        "include_stop_str_in_output",
        "skip_special_tokens",
        "return_token_ids",
        "add_generation_prompt",
        "continue_final_message",
        "echo",
    }
)
#: vLLM ``EngineArgs`` fields srdq sets itself (from --model).
VLLM_OWN_FIELDS = frozenset({"model", "tokenizer"})


# ----------------------------------------------------------------------------------------------- parsing
def parse_engine_arg_pairs(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``KEY=VALUE`` strings (``--engine-arg``) into a dict of raw text values (the engine's check parses
    them: ``check_engine_args``). A missing ``=``, an empty key or a key given twice is a ConfigError."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--engine-arg expects KEY=VALUE, got {pair!r}")
        if key in out:
            raise ConfigError(f"--engine-arg {key} is given twice")
        out[key] = value.strip()
    return out


def parse_scalar(text: str) -> Any:
    """``text`` read as a YAML scalar (int, float, bool, null, else the text); a list or mapping stays
    the text too (the argument's type decides whether text is acceptable)."""
    import yaml

    try:
        value = yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        return text
    return value if _is_scalar(value) else text


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


# ----------------------------------------------------------------------------------------------- types
def _accepts(tp: Any, value: Any) -> bool:
    """Whether ``value`` (a scalar) fits the annotation ``tp``. Structured types (lists, mappings, config
    classes) accept no scalar."""
    if tp is Any:
        return True
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(tp))
    if origin is typing.Union or origin is types.UnionType:
        return any(_accepts(a, value) for a in typing.get_args(tp))
    if tp is type(None) or tp is None:
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return any(value in (m.name, m.value) for m in tp)
    return False


def _scalar_possible(tp: Any) -> bool:
    """Whether some scalar fits the annotation ``tp`` (False for lists, mappings, config classes)."""
    origin = typing.get_origin(tp)
    if tp is Any or origin is typing.Literal:
        return True
    if origin is typing.Union or origin is types.UnionType:
        return any(_scalar_possible(a) for a in typing.get_args(tp) if a is not type(None))
    if tp in (bool, int, float, str):
        return True
    return isinstance(tp, type) and issubclass(tp, enum.Enum)


_NAMES: dict[Any, str] = {bool: "true or false", int: "an integer", float: "a number", str: "text"}


def describe_type(tp: Any) -> str:
    """A short human name of an annotation: ``int``, ``int or null``, ``one of 'eager', 'sdpa'``."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(dict.fromkeys(describe_type(a) for a in typing.get_args(tp)))
    if tp is type(None) or tp is None:
        return "null"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(repr(m.name) for m in tp)
    if tp in _NAMES:
        return _NAMES[tp]
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _coerce(key: str, arg: Arg, value: Any, *, raw: str | None, where: str) -> Any:
    """The value of ``key`` as the argument takes it, or ConfigError naming key, value and type."""
    if not _is_scalar(value):
        raise ConfigError(f"{where} {key}: give a scalar (number, true/false, null or text), got {value!r}")
    if _accepts(arg.type, value):
        return value
    if _accepts(arg.type, "text"):  # takes text: the text as given (revision=1234 is "1234")
        if raw is not None:
            return raw
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
    shown = raw if raw is not None else value
    raise ConfigError(f"{where} {key}={shown!r}: expects {describe_type(arg.type)}")


def _unknown(key: str, engine: str, accepted: list[str], where: str, extra: str = "") -> ConfigError:
    close = difflib.get_close_matches(key, accepted, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    listed = "" if close or len(accepted) > 30 else f"; accepted: {', '.join(sorted(accepted))}"
    return ConfigError(f"{where} {key}: not an argument of the {engine} engine{hint}{listed}{extra}")


# ----------------------------------------------------------------------------------------------- engines
def _check_table(
    engine: str,
    table: Mapping[str, Arg],
    args: Mapping[str, Any],
    *,
    raw: bool,
    where: str,
    aliases: Mapping[str, str] | None = None,
    extra: str = "",
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in args.items():
        name = (aliases or {}).get(key, key)
        if name in out:
            raise ConfigError(f"{where} {key}: given twice (as {name} too)")
        arg = table.get(name)
        if arg is None:
            raise _unknown(key, engine, list(table), where, extra)
        out[name] = _coerce(
            key, arg, parse_scalar(value) if raw else value, raw=value if raw else None, where=where
        )
    return out


def _check_transformers(args: Mapping[str, Any], raw: bool, where: str) -> dict[str, Any]:
    out = _check_table(engine="transformers", table=TRANSFORMERS_ARGS, args=args, raw=raw, where=where,
                       aliases=TRANSFORMERS_ALIASES)  # fmt: skip
    if "max_batch_size" in out and out["max_batch_size"] < 1:
        raise ConfigError(f"{where} max_batch_size must be >= 1, got {out['max_batch_size']}")
    return out


def vllm_engine_args() -> dict[str, Arg] | None:
    """vLLM's ``EngineArgs`` fields with their types, or None where vLLM is not installed. Imports vLLM's
    argument module (seconds): called only when a run gives vLLM engine arguments."""
    import dataclasses
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return None
    from vllm.engine.arg_utils import EngineArgs

    try:
        hints = typing.get_type_hints(EngineArgs)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: the raw field types
        hints = {}
    return {
        f.name: Arg(hints.get(f.name, f.type))
        for f in dataclasses.fields(EngineArgs)
        if not f.name.startswith("_") and f.name not in VLLM_OWN_FIELDS
    }


def _check_vllm(args: Mapping[str, Any], raw: bool, where: str) -> dict[str, Any]:
    for own in VLLM_OWN_FIELDS & set(args):
        raise ConfigError(f"{where} {own}: srdq sets vLLM's {own} from --model")
    table = vllm_engine_args()
    if table is None:
        log.warning(
            "vLLM is not installed here: the %s keys %s are checked by the workers when they build the engine",
            where,
            ", ".join(sorted(args)),
        )
        unchecked = {k: parse_scalar(v) if raw else v for k, v in args.items()}
        for key, value in unchecked.items():
            if not _is_scalar(value):
                raise ConfigError(
                    f"{where} {key}: give a scalar (number, true/false, null or text), got {value!r}"
                )
        return unchecked
    out: dict[str, Any] = {}
    for key, value in args.items():
        arg = table.get(key)
        if arg is None:
            raise _unknown(key, "vllm", list(table), where, " (vLLM's EngineArgs fields)")
        if not _scalar_possible(arg.type):
            raise ConfigError(
                f"{where} {key}: vLLM's {key} takes a structured value ({describe_type(arg.type)}); "
                "srdq passes scalars only"
            )
        parsed = parse_scalar(value) if raw else value
        out[key] = _coerce(key, arg, parsed, raw=value if raw else None, where=where)
    return out


def _check_openai(args: Mapping[str, Any], raw: bool, where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    plain: dict[str, Any] = {}
    for key, value in args.items():
        kind, dot, name = key.partition(".")
        if dot and kind == "body":
            if not name or name in OPENAI_OWN_FIELDS:
                raise ConfigError(
                    f"{where} {key}: the openai engine sets '{name}' itself (srdq's sampling parameters: "
                    "--set, --max-new-tokens)"
                    if name
                    else f"{where} {key}: name the body field: body.FIELD"
                )
            parsed = parse_scalar(value) if raw else value
            out[key] = _coerce(key, Arg(Scalar), parsed, raw=None, where=where)
        elif dot and kind == "header":
            if not name:
                raise ConfigError(f"{where} {key}: name the header: header.NAME")
            if name.lower() == "authorization":
                raise ConfigError(
                    f"{where} {key}: set the bearer token with SRDQ_OPENAI_API_KEY (engine arguments enter the "
                    "run's spec, which is stored in clear)"
                )
            out[key] = _coerce(key, Arg(str), value, raw=value if raw else None, where=where)
        else:
            plain[key] = value
    extra = " (also: body.FIELD for a request field, header.NAME for an HTTP header)"
    out.update(_check_table("openai", OPENAI_ARGS, plain, raw=raw, where=where, extra=extra))
    return dict(sorted(out.items()))


CHECKS: dict[str, Callable[[Mapping[str, Any], bool, str], dict[str, Any]]] = {
    "transformers": _check_transformers,
    "vllm": _check_vllm,
    "openai": _check_openai,
}


def check_engine_args(
    engine: str, args: Mapping[str, Any] | None, *, raw: bool = False, where: str = "--engine-arg"
) -> dict[str, Any]:
    """The engine arguments of engine ``engine`` checked and normalised (aliases renamed, values typed,
    keys sorted): ConfigError naming the first bad key or value. ``raw``: the values are the text of
    ``--engine-arg`` (parsed here as YAML scalars); else already typed (a sweep file). ``where`` names the
    source in messages (``--engine-arg``, ``engine_args``)."""
    if not args:
        return {}
    if not isinstance(args, Mapping):
        raise ConfigError(f"{where} must be a mapping of KEY: VALUE, got {args!r}")
    for key in args:
        if not isinstance(key, str) or not key.strip():
            raise ConfigError(f"{where}: keys must be non-empty names, got {key!r}")
    check = CHECKS.get(engine)
    if check is None:
        raise ConfigError(f"{where}: engine {engine!r} takes no engine arguments")
    return dict(sorted(check(args, raw, where).items()))


def openai_api(args: Mapping[str, Any] | None) -> str:
    """The openai engine's endpoint family for these (checked) engine arguments: completions or chat."""
    return str((args or {}).get("api", "completions"))


def openai_continues(args: Mapping[str, Any] | None) -> bool:
    """Whether the openai engine can continue a partial answer with these (checked) engine arguments: always
    on /v1/completions; on the chat API only with ``continue_final_message`` (the default)."""
    return openai_api(args) != "chat" or bool((args or {}).get("continue_final_message", True))
