"""OpenAI-compatible engine: the Engine contract over a model server's ``/v1/completions`` endpoint.

Fleet workers with ``--engine openai`` hold no model: N model servers (``vllm serve`` with tensor
parallelism, SGLang, llama.cpp's server, TGI's OpenAI front end) hold the weights and M light workers
send them requests. Settings (environment, ``Settings``):

- ``SRDQ_OPENAI_BASE_URL`` (required): the server's API root, e.g. ``http://gpu-node-1:8000/v1``;
- ``SRDQ_OPENAI_API_KEY`` (else ``OPENAI_API_KEY``, else none): sent as ``Authorization: Bearer``;
- ``SRDQ_OPENAI_TOKENIZER``: where the tokenizer is loaded from locally (a model folder, a cached
  Hugging Face id, ``smollm2``, ``testbed``, ``tiny-random-llama``); default: the run's ``--model``.
  Only the tokenizer files are read (a few MB), never the weights;
- ``SRDQ_OPENAI_CONCURRENCY`` (16): requests in flight per engine (the server batches them);
- ``SRDQ_OPENAI_TIMEOUT_S`` (600): per-request read timeout; ``SRDQ_OPENAI_RETRY_S`` (300): how long a
  request is retried on connection errors, timeouts, 429 and 5xx (exponential backoff with full jitter,
  ``tenacity``) before the engine gives up with ``EngineUnavailable``;
- ``SRDQ_OPENAI_MAX_CONTEXT``: the model's context, when the server does not report ``max_model_len``.

The run's ``--model`` is the model name the server serves (``--served-model-name`` in vLLM); the engine
checks at start-up that ``GET /models`` lists it.

Requests: one ``POST /completions`` per request (concurrently), ``prompt`` = the token ids (prompt +
kept prefix, never re-tokenised text: vLLM and llama.cpp's server accept a list of token ids),
``max_tokens`` (cut to the room left in the context), ``temperature`` (0 = greedy), ``top_p``,
``top_k`` (omitted when off), ``seed`` (per request), ``stop`` strings, ``logprobs: 1`` when asked, and
vLLM's extra fields ``stop_token_ids`` (the tokenizer's EOS set, chat end-of-turn tokens included, as in
the other engines), ``include_stop_str_in_output``, ``skip_special_tokens: false`` and
``return_token_ids`` (the generated token ids, so nothing is re-tokenised on the way back either).
A server that does not return token ids: the ids come from ``logprobs.tokens`` when they are written as
``token_id:N`` (vLLM's ``--return-tokens-as-token-ids``), else from encoding the returned text with the
local tokenizer (lossy: a text can encode to other ids than the ones sampled; the engine's
``token_ids_source`` says which path ran). EOS handling and ``text`` as in the vLLM engine: the EOS token
is kept in ``token_ids``, ``text`` is the local tokenizer's decoding with special tokens skipped.

Teacher-forced ``logprobs(pairs)``: one request over ``prefix + continuation`` with ``max_tokens: 1``
and vLLM's ``prompt_logprobs: 1``, reading each continuation token's logprob (vLLM-specific; another
server answers with an EngineError naming the missing field). One-token continuations of one prefix (a
judge's "Yes" / "No" answers) take one request for the prefix instead: greedy, one token, the top 20
``logprobs`` of that token named by id (vLLM's ``return_tokens_as_token_ids``); no prompt logprobs, so
the server may read its prefix cache. A candidate outside those 20, or a server that does not name
tokens by id, gets its own ``prompt_logprobs`` request; a server that refuses the request (a smaller
``--max-logprobs``) is asked pair by pair from then on.

Engine arguments (``--engine-arg``, ``engines.engine_args``): ``body.FIELD=VALUE`` adds a field to every
request's JSON body (e.g. ``body.min_p=0.05``, ``body.repetition_penalty=1.1``; the fields above stay
srdq's), ``header.NAME=VALUE`` an HTTP header, and ``api`` picks the endpoint family:

- ``api=completions`` (default): ``/v1/completions`` as described above; what srdq needs, since every
  request is a token-id prefix to continue;
- ``api=chat``: ``/v1/chat/completions``, for servers that accept messages only. The engine gets token
  ids (the chat template applied to the task's messages, then the kept prefix of a partial answer), so it
  recovers the messages from them (``ChatPrompts``: the local tokenizer's chat template rendered with
  placeholder contents, matched against the decoded prompt, and checked by re-encoding) and sends them;
  the server applies its own template. A request with a kept prefix (SRD's rounds and suffix
  regeneration, chunked rounds, rejection sampling, beam search steps) is sent with the prefix as a final
  assistant message and vLLM's ``continue_final_message: true, add_generation_prompt: false``
  extensions; ``continue_final_message=false`` (a server without them) refuses such requests, and the
  methods that make them are refused at submit (``wiring.check_spec``). What the chat API cannot give:
  teacher-forced scoring of given token ids (no ``prompt`` of ids: the ``logprob`` and ``lm_judge``
  rewards are refused; capabilities drop ``logprobs``), and exact continuation: the server re-tokenises
  the kept prefix from its text, which may give other ids than the ones sampled (a byte-level BPE over
  text it produced itself round-trips, bytes that are not UTF-8 on their own do not; ``chat_lossy_prefixes``
  counts the kept prefixes that do not survive decoding and encoding here, with a warning the first time,
  and ``chat_prompt_drift`` the requests whose prompt ids, returned by vLLM with ``return_token_ids``,
  differ from the engine's). Generated token ids come back
  as with completions (``return_token_ids``), and logprobs of sampled tokens from ``logprobs.content``.

Failures: a transient failure (connection refused or reset, timeout, 429, 5xx) is retried for
``SRDQ_OPENAI_RETRY_S``; a server that stays down raises ``EngineUnavailable``, which ends the slice
without an item error: ``srdq run`` exits with one line (run it again to resume from the last
checkpoint), a fleet worker releases the shard as pending without counting an attempt, and the shard
resumes when the server is back. Other 4xx answers (a bad request) raise ``EngineError`` at once.

Capabilities: sampling and logprobs; no full next-token distributions, no gradients (the
speculative-decoding family and gradient-based methods are refused at submit time).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from srd_worker.engines.base import (
    CAP_LOGPROBS,
    CAP_SAMPLING,
    Generation,
    GenerationRequest,
    SamplingParams,
    answer_groups,
    read_answers,
    token_budget,
)
from srd_worker.engines.logprob_memo import scoring_plan
from srd_worker.errors import ConfigError, EngineError, EngineUnavailable, ModelLoadError

if TYPE_CHECKING:
    from srd_worker.settings import Settings

log = logging.getLogger("srdq.openai")

_SEED_MASK = 0x7FFF_FFFF_FFFF_FFFF  # int64, what servers validate seeds against
_TRANSIENT_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class _Transient(Exception):
    """A failure worth retrying (connection, timeout, 429, 5xx)."""


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, _Transient)


class OpenAIClient:
    """HTTP calls to an OpenAI-compatible server with retries (tenacity) on transient failures."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        retry_s: float = 300.0,
        concurrency: int = 16,
        backoff_max_s: float = 30.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        import requests
        from requests.adapters import HTTPAdapter

        if not base_url or not base_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"a model server's URL must be http(s), such as http://127.0.0.1:8000/v1; got {base_url!r}"
            )
        self.base_url = base_url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.retry_s = float(retry_s)
        self.backoff_max_s = float(backoff_max_s)
        self._session = requests.Session()
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=max(1, int(concurrency)))
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)
        self._session.headers.update(headers or {})
        if api_key:
            self._session.headers["Authorization"] = f"Bearer {api_key}"
        self._requests = requests
        self.retries = 0  # transient failures retried since the client was built (all threads)
        self._lock = threading.Lock()

    def close(self) -> None:
        self._session.close()

    def _once(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        url = f"{self.base_url}{path}"
        try:
            resp = self._session.request(method, url, json=body, timeout=(10.0, self.timeout_s))
        except (self._requests.ConnectionError, self._requests.Timeout) as exc:
            raise _Transient(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code in _TRANSIENT_STATUS:
            raise _Transient(f"{method} {url}: HTTP {resp.status_code} {resp.text[:300]}")
        if resp.status_code >= 400:
            raise EngineError(f"{method} {url}: HTTP {resp.status_code}: {resp.text[:500]}")
        try:
            return resp.json()
        except ValueError as exc:
            raise EngineError(f"{method} {url}: the answer is not JSON: {resp.text[:200]!r}") from exc

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One call, retried with exponential backoff and jitter while it fails transiently, for at most
        ``retry_s`` seconds; then ``EngineUnavailable`` naming the server and the last error."""
        from tenacity import (
            RetryError,
            Retrying,
            retry_if_exception,
            stop_after_delay,
            wait_random_exponential,
        )

        def note(state: Any) -> None:
            with self._lock:
                self.retries += 1
            if state.attempt_number in (1, 5) or state.attempt_number % 20 == 0:
                log.warning(
                    "model server %s: %s (attempt %d; retrying for up to %.0f s)",
                    self.base_url,
                    state.outcome.exception(),
                    state.attempt_number,
                    self.retry_s,
                )

        retrying = Retrying(
            retry=retry_if_exception(_is_transient),
            wait=wait_random_exponential(multiplier=0.25, max=self.backoff_max_s),  # full jitter
            stop=stop_after_delay(self.retry_s),
            before_sleep=note,
        )
        try:
            return retrying(self._once, method, path, body)
        except RetryError as exc:
            last = exc.last_attempt.exception()
            raise EngineUnavailable(
                f"model server {self.base_url} unavailable for {self.retry_s:g} s "
                f"(SRDQ_OPENAI_RETRY_S): {last}"
            ) from last
        except _Transient as exc:  # stop fired before a retry was scheduled
            raise EngineUnavailable(f"model server {self.base_url} unavailable: {exc}") from exc


def _load_tokenizer(name: str, settings: Settings) -> Any:
    """The HF tokenizer of ``name`` (see the module docstring), wrapped as the engine's Tokenizer. Only
    tokenizer files are read: ``smollm2``'s comes from its GGUF file, not from the exported model."""
    from srd_worker.engines.loading import (
        SMOLLM2_GGUF,
        SMOLLM2_NAMES,
        TINY_MODEL,
        resolve_model_path,
        smollm2_dir,
    )
    from srd_worker.engines.transformers_engine import HFTokenizer

    if name == TINY_MODEL:
        from srd_worker.engines.loading import build_tiny_llama

        return HFTokenizer(build_tiny_llama(hidden_size=8, layers=1)[1])
    from transformers import AutoTokenizer

    try:
        if name in SMOLLM2_NAMES:
            return HFTokenizer(AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF))
        return HFTokenizer(AutoTokenizer.from_pretrained(resolve_model_path(name, settings.cache_dir)))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"cannot load the tokenizer '{name}' for the openai engine: {exc}. Set SRDQ_OPENAI_TOKENIZER to a "
            "local model folder or a Hugging Face id already in the local cache (only the tokenizer files "
            "are read)"
        ) from exc


#: Placeholder content the chat template is rendered with to find where each message's content goes.
_SLOT = "@@srdq-content-7f3a@@"
#: The message layouts tasks and rewards send (``Task.messages``: an optional system turn, one user turn).
_LAYOUTS = (("system", "user"), ("user",))


class ChatPrompts:
    """The chat messages (and the kept prefix of a partial answer) behind a prompt of token ids made by
    ``HFTokenizer.chat_prompt_ids`` (the chat API takes messages, not ids). The tokenizer's chat template is
    rendered once per layout (system + user, user) with a placeholder content; a prompt's decoded text is
    matched against it, and the messages found are checked by rendering and encoding them again: their ids
    must be the prompt's first ids, and the rest is the kept prefix."""

    def __init__(self, hf_tokenizer: Any) -> None:
        import re

        if not getattr(hf_tokenizer, "chat_template", None):
            raise ConfigError(
                "--engine-arg api=chat needs the tokenizer's chat template (to turn srdq's prompts back into "
                "messages), and this tokenizer has none: use api=completions, or set SRDQ_OPENAI_TOKENIZER "
                "to the served model's tokenizer"
            )
        self.hf = hf_tokenizer
        self.layouts: list[tuple[tuple[str, ...], Any]] = []
        for roles in _LAYOUTS:
            try:
                text = self._render([{"role": r, "content": _SLOT} for r in roles])
            except Exception:  # noqa: BLE001 - a template without a system role: that layout does not exist
                continue
            parts = text.split(_SLOT)
            if len(parts) != len(roles) + 1:
                continue
            pattern = "".join(re.escape(p) + "(.*?)" for p in parts[:-1]) + re.escape(parts[-1]) + "(.*)"
            self.layouts.append((roles, re.compile(pattern, re.DOTALL)))

    def _render(self, messages: list[dict[str, str]]) -> str:
        return str(self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))

    def split(self, prompt_ids: Sequence[int], index: int = 0) -> tuple[list[dict[str, str]], list[int]]:
        """(messages, kept prefix ids) of one prompt; EngineError when it is not the chat template applied
        to a system and/or user message."""
        ids = [int(t) for t in prompt_ids]
        text = self.hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        for roles, pattern in self.layouts:
            match = pattern.fullmatch(text)
            if match is None:
                continue
            messages = [{"role": r, "content": c} for r, c in zip(roles, match.groups()[:-1], strict=True)]
            head = list(self.hf.encode(self._render(messages), add_special_tokens=False))
            if ids[: len(head)] == head:
                return messages, ids[len(head) :]
        raise EngineError(
            f"request {index}: its prompt is not the tokenizer's chat template applied to a system and/or user "
            "message, so the chat API (--engine-arg api=chat) cannot be sent it: use api=completions"
        )

    def text(self, ids: Sequence[int]) -> str:
        """The kept prefix as the text of the final assistant message."""
        return str(
            self.hf.decode(
                [int(t) for t in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        )


def api_key(settings: Settings) -> str | None:
    """The bearer token for a model server: ``SRDQ_OPENAI_API_KEY``, else ``OPENAI_API_KEY``, else none."""
    key: Any = settings.openai_api_key
    key = key.get_secret_value() if hasattr(key, "get_secret_value") else key
    return key or os.environ.get("OPENAI_API_KEY") or None


def server_url(value: str | None, setting: str, needed_by: str, example: str) -> str:
    """``value``, a server's URL read from ``setting``; ConfigError naming the setting when it is missing or
    not an http(s) URL (``needed_by`` says what needs it)."""
    if not value:
        raise ConfigError(f"{needed_by} needs the server's URL: set {setting} (e.g. {example})")
    if not str(value).startswith(("http://", "https://")):
        raise ConfigError(f"{setting} must be an http(s) URL such as {example}, got {value!r}")
    return str(value)


def check_settings(settings: Settings) -> str:
    """The server URL from the settings; ConfigError naming SRDQ_OPENAI_BASE_URL when it is missing or not
    an http(s) URL (``srdq run`` checks this before it writes anything)."""
    return server_url(
        settings.openai_base_url, "SRDQ_OPENAI_BASE_URL", "the openai engine", "http://127.0.0.1:8000/v1"
    )


class OpenAIEngine:
    name = "openai"
    capabilities = frozenset({CAP_SAMPLING, CAP_LOGPROBS})

    def __init__(
        self,
        client: OpenAIClient,
        model: str,
        tokenizer: Any,
        *,
        max_context: int | None = None,
        concurrency: int = 16,
        tokenizer_source: str = "",
        api: str = "completions",
        continue_final_message: bool = True,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        """Check that the server serves ``model`` (``GET /models``) and read its context length and
        version for the run's records. ``EngineUnavailable`` when the server cannot be reached. ``api``:
        ``completions`` or ``chat`` (module docstring); ``extra_body``: fields added to every request."""
        from srd_worker.engines.engine_args import OPENAI_APIS
        from srd_worker.engines.transformers_engine import EngineStats, HFTokenizer

        if api not in OPENAI_APIS:
            raise ConfigError(f"api must be one of {', '.join(OPENAI_APIS)}, got {api!r}")
        self.api = api
        self.continue_final_message = bool(continue_final_message)
        self.extra_body = dict(extra_body or {})
        self.chat_prompt_drift = 0  # chat requests whose prompt ids on the server differ from the engine's
        self.chat_lossy_prefixes = 0  # chat requests whose kept prefix does not survive decode → encode
        self.client = client
        self.model = model
        self.model_name = model
        self.tokenizer = tokenizer if isinstance(tokenizer, HFTokenizer) else HFTokenizer(tokenizer)
        self.chat = ChatPrompts(self.tokenizer.hf) if api == "chat" else None
        if self.chat is not None:  # the chat API cannot score given token ids (module docstring)
            self.capabilities = frozenset({CAP_SAMPLING})
        self.tokenizer_source = tokenizer_source
        self.concurrency = max(1, int(concurrency))
        self.stats = EngineStats()
        self.token_ids_source: str | None = None  # "server", "logprobs" or "re-encoded" (last generate)
        #: one-token continuations of one prefix are read from its next token's top logprobs (vLLM's
        #: default --max-logprobs is 20); 0: every pair its own prompt_logprobs request
        self.next_token_top_k = 20
        self._pool: ThreadPoolExecutor | None = None
        listing = client.call("GET", "/models")
        cards = [c for c in (listing or {}).get("data") or [] if isinstance(c, dict)]
        served = [str(c.get("id")) for c in cards]
        card = next((c for c in cards if c.get("id") == model), None)
        if card is None:
            raise ConfigError(
                f"the model server {client.base_url} does not serve '{model}' (it serves: "
                f"{', '.join(served) or 'nothing'}); pass --model with one of those names"
            )
        self.server_model = dict(card)
        reported = card.get("max_model_len")
        if max_context:
            self.max_context = int(max_context)
        elif isinstance(reported, int) and reported > 0:
            self.max_context = reported
        else:
            raise ConfigError(
                f"the model server {client.base_url} does not report max_model_len for '{model}': set "
                "SRDQ_OPENAI_MAX_CONTEXT to the model's context length"
            )
        self.server_version = self._server_version()

    @classmethod
    def from_settings(
        cls, model: str, settings: Settings, engine_args: dict[str, Any] | None = None
    ) -> OpenAIEngine:
        """The engine the settings describe, with the run's (checked) engine arguments: ``api``,
        ``continue_final_message``, ``body.FIELD`` and ``header.NAME`` (``engines.engine_args``)."""
        args = dict(engine_args or {})
        extra_body = {k.split(".", 1)[1]: v for k, v in args.items() if k.startswith("body.")}
        headers = {k.split(".", 1)[1]: str(v) for k, v in args.items() if k.startswith("header.")}
        base = check_settings(settings)
        key = api_key(settings)
        concurrency = int(settings.openai_concurrency)
        client = OpenAIClient(
            base,
            api_key=key,
            timeout_s=float(settings.openai_timeout_s),
            retry_s=float(settings.openai_retry_s),
            concurrency=concurrency,
            headers=headers,
        )
        tokenizer_name = settings.openai_tokenizer or model
        tokenizer = _load_tokenizer(tokenizer_name, settings)
        return cls(
            client,
            model,
            tokenizer,
            max_context=settings.openai_max_context,
            concurrency=concurrency,
            tokenizer_source=tokenizer_name,
            api=str(args.get("api", "completions")),
            continue_final_message=bool(args.get("continue_final_message", True)),
            extra_body=extra_body,
        )

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self.client.close()

    def _server_version(self) -> str:
        """vLLM's ``GET /version`` (at the server root, beside ``/v1``); 'unknown' where there is none."""
        import requests

        root = self.client.base_url.removesuffix("/v1")
        try:
            resp = self.client._session.get(f"{root}/version", timeout=5)
            if resp.ok:
                return str(resp.json().get("version", "unknown"))
        except (requests.RequestException, ValueError, AttributeError):
            pass
        return "unknown"

    def describe(self) -> dict[str, Any]:
        """What this engine ran with, for the run's records (``srd_worker.provenance``)."""
        return {
            "server_url": self.client.base_url,
            "server_model": {
                k: self.server_model.get(k) for k in ("id", "root", "owned_by", "max_model_len")
            },
            "server_version": self.server_version,
            "tokenizer": self.tokenizer_source,
            "max_context": self.max_context,
            "api": self.api,
        }

    def _map(self, fn: Any, jobs: Sequence[Any]) -> list[Any]:
        if len(jobs) <= 1:
            return [fn(j) for j in jobs]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="srdq-openai")
        return list(self._pool.map(fn, jobs))

    # ------------------------------------------------------------------ generation
    def _body(self, prompt: Sequence[int], p: SamplingParams, budget: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": [int(t) for t in prompt],
            "max_tokens": int(budget),
            "temperature": float(p.temperature),
            "top_p": float(p.top_p),
            "n": 1,
            "stream": False,
            "stop_token_ids": sorted(self.tokenizer.eos_token_ids),
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
            "return_token_ids": True,
        }
        if p.top_k > 0:
            body["top_k"] = int(p.top_k)
        if p.seed is not None:
            body["seed"] = int(p.seed) & _SEED_MASK
        if p.stop:
            body["stop"] = list(p.stop)
        if p.logprobs:
            body["logprobs"] = 1
        body.update(self.extra_body)
        return body

    def _chat_body(self, i: int, prompt: Sequence[int], p: SamplingParams, budget: int) -> dict[str, Any]:
        """The /chat/completions body of request ``i``: the completions body with ``messages`` for
        ``prompt``, and a kept prefix as a final assistant message to continue (module docstring)."""
        assert self.chat is not None
        messages, kept = self.chat.split(prompt, i)
        body = self._body(prompt, p, budget)
        del body["prompt"]
        body["messages"] = messages
        if kept:
            if not self.continue_final_message:
                raise EngineError(
                    f"request {i} continues a partial answer ({len(kept)} tokens), which the chat API cannot do "
                    "with --engine-arg continue_final_message=false: use api=completions"
                )
            text = self.chat.text(kept)
            if self.tokenizer.encode(text) != kept:
                # e.g. bytes that are not UTF-8 on their own: the server continues from other ids
                with self.client._lock:
                    self.chat_lossy_prefixes += 1
                    first = self.chat_lossy_prefixes == 1
                if first:
                    log.warning(
                        "chat API: a kept prefix of %d tokens does not survive its text round trip (the server "
                        "re-tokenises it); continuation through the chat API is approximate for such prefixes",
                        len(kept),
                    )
            body["messages"] = [*messages, {"role": "assistant", "content": text}]
            body["add_generation_prompt"] = False
            body["continue_final_message"] = True
        if p.logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = 0
        return body

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        t0 = time.perf_counter()
        jobs = []
        out: list[Generation | None] = [None] * len(requests)
        for i, r in enumerate(requests):
            budget = token_budget(i, r, self.max_context)
            if budget == 0:
                out[i] = Generation([], "", "length", [] if r.params.logprobs else None)
                continue
            jobs.append((i, r, budget))

        def one(job: tuple[int, GenerationRequest, int]) -> Generation:
            i, r, budget = job
            if self.chat is not None:
                answer = self.client.call(
                    "POST", "/chat/completions", self._chat_body(i, r.prompt_ids, r.params, budget)
                )
                served = (answer or {}).get("prompt_token_ids") if isinstance(answer, dict) else None
                if isinstance(served, list) and [int(t) for t in served] != list(r.prompt_ids):
                    with self.client._lock:
                        self.chat_prompt_drift += 1
                return self._to_generation(answer, r.params, i)
            answer = self.client.call("POST", "/completions", self._body(r.prompt_ids, r.params, budget))
            return self._to_generation(answer, r.params, i)

        for (i, r, _), gen in zip(jobs, self._map(one, jobs), strict=True):
            out[i] = gen
            self.stats.generated_tokens += len(gen.token_ids)
            self.stats.prefill_tokens += len(r.prompt_ids)
        self.stats.generate_calls += 1
        self.stats.generate_seconds += time.perf_counter() - t0
        return [g for g in out if g is not None]

    def _choice(self, answer: Any, what: str) -> dict[str, Any]:
        try:
            choice = answer["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise EngineError(f"{what}: the server's answer has no choices: {str(answer)[:300]}") from None
        if not isinstance(choice, dict):
            raise EngineError(f"{what}: malformed choice {str(choice)[:200]}")
        return choice

    def _token_ids(self, choice: dict[str, Any]) -> list[int]:
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            self.token_ids_source = "server"
            return [int(t) for t in ids]
        tokens = ((choice.get("logprobs") or {}).get("tokens")) or None
        if tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            self.token_ids_source = "logprobs"
            return [int(t.split(":", 1)[1]) for t in tokens]
        self.token_ids_source = "re-encoded"
        text = choice.get("text")
        if text is None:  # a chat answer
            text = (choice.get("message") or {}).get("content")
        return self.tokenizer.encode(str(text or ""))

    def _to_generation(self, answer: Any, p: SamplingParams, i: int) -> Generation:
        choice = self._choice(answer, f"request {i}")
        ids = self._token_ids(choice)
        server_reason = choice.get("finish_reason")
        if ids and ids[-1] in self.tokenizer.eos_token_ids:
            reason = "eos"
        elif server_reason == "stop":
            reason = "stop" if p.stop else "eos"
        elif server_reason == "length":
            reason = "length"
        else:
            raise EngineError(
                f"request {i}: the server ended the request with finish_reason {server_reason!r}"
            )
        logps = None
        if p.logprobs:
            found = choice.get("logprobs") or {}
            values = found.get("token_logprobs")
            if values is None and isinstance(found.get("content"), list):  # a chat answer
                values = [e.get("logprob") if isinstance(e, dict) else None for e in found["content"]]
            if not isinstance(values, list) or len(values) != len(ids):
                raise EngineError(
                    f"request {i}: the server returned {0 if not isinstance(values, list) else len(values)} "
                    f"logprobs for {len(ids)} tokens"
                )
            if any(v is None for v in values):
                raise EngineError(f"request {i}: the server returned a null logprob")
            logps = [float(v) for v in values]
        return Generation(
            token_ids=ids, text=self.tokenizer.decode(ids), finish_reason=reason, logprobs=logps
        )

    # ------------------------------------------------------------------ scoring
    def logprobs(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[float]]:
        """Teacher-forced logprobs with vLLM's ``prompt_logprobs`` (one request per pair), except for
        one-token continuations of one prefix (a judge's candidate answers): one request for the prefix
        reads them from the top logprobs of its next token (``_next_token_logprobs``)."""
        if self.chat is not None:
            raise EngineError(
                "teacher-forced scoring of given token ids needs /v1/completions (a prompt of ids); the "
                "openai engine runs with --engine-arg api=chat"
            )
        out: list[list[float]] = [[] for _ in pairs]
        jobs = []
        for i, (p, c) in enumerate(pairs):
            if not p:
                raise EngineError(f"pair {i}: teacher-forced scoring needs a non-empty prefix")
            n = len(p) + len(c)
            if n >= self.max_context:  # the server also samples one token, which needs a free position
                raise EngineError(f"pair {i}: {n} tokens leave no room in the context of {self.max_context}")
            if c:
                jobs.append(i)
        groups = answer_groups(pairs, jobs) if self.next_token_top_k > 1 else {}
        if groups:
            for i, lp in read_answers(
                pairs, groups, self._map(self._next_token_logprobs, list(groups))
            ).items():
                out[i] = [lp]
        # the rest, and candidates outside the top returned; a pair whose prefix + continuation another
        # pair's starts with is read from that pair's request (SRD's boundary search: prefixes of a response)
        seqs = {i: [*pairs[i][0], *pairs[i][1]] for i in jobs if not out[i]}
        root, first = scoring_plan(seqs, {i: len(pairs[i][0]) for i in seqs})
        roots = list(first)
        rows = self._map(
            lambda r: self._prompt_logprobs((seqs[r][: first[r]], seqs[r][first[r] :]), r), roots
        )
        got = dict(zip(roots, rows, strict=True))  # per root, the logprobs of its tokens first[r] … n-1
        for i, r in root.items():
            out[i] = got[r][len(pairs[i][0]) - first[r] : len(seqs[i]) - first[r]]
        return out

    def _next_token_logprobs(self, prefix: tuple[int, ...]) -> dict[int, float]:
        """The top ``next_token_top_k`` logprobs of the token after ``prefix`` by token id (one greedy
        one-token request with ``logprobs`` and vLLM's ``return_tokens_as_token_ids``; no
        ``prompt_logprobs``, so vLLM may read its prefix cache). Empty when the server does not name
        the tokens by id: the caller then asks pair by pair."""
        body = {
            "model": self.model,
            "prompt": list(prefix),
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": self.next_token_top_k,
            "return_tokens_as_token_ids": True,
        }
        try:
            answer = self.client.call("POST", "/completions", body)
        except EngineUnavailable:
            raise
        except EngineError as exc:  # e.g. a server started with a smaller --max-logprobs: HTTP 400
            log.warning(
                "the server refused a next-token top-logprobs request (%s); scoring pair by pair", exc
            )
            self.next_token_top_k = 0
            return {}
        choice = self._choice(answer, "a judged prefix")
        tops = (choice.get("logprobs") or {}).get("top_logprobs") or []
        top = tops[0] if tops and isinstance(tops[0], dict) else {}
        out: dict[int, float] = {}
        for key, value in top.items():
            if not (isinstance(key, str) and key.startswith("token_id:")) or value is None:
                return {}
            try:
                out[int(key.split(":", 1)[1])] = float(value)
            except ValueError:
                return {}
        return out

    def _prompt_logprobs(self, pair: tuple[Sequence[int], Sequence[int]], i: int) -> list[float]:
        prefix, cont = pair
        ids = [int(t) for t in prefix] + [int(t) for t in cont]
        body = {
            "model": self.model,
            "prompt": ids,
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 1,
        }
        choice = self._choice(self.client.call("POST", "/completions", body), f"pair {i}")
        entries = choice.get("prompt_logprobs")
        if not isinstance(entries, list) or len(entries) != len(ids):
            raise EngineError(
                f"pair {i}: the server returned no prompt_logprobs for the whole sequence (teacher-forced "
                "scoring needs vLLM's prompt_logprobs)"
            )
        values = []
        for j, t in enumerate(cont):
            entry = entries[len(prefix) + j] or {}
            lp = entry.get(str(int(t)), entry.get(int(t)) if isinstance(entry, dict) else None)
            if lp is None:
                raise EngineError(f"pair {i}: no logprob for token {t} at position {j}")
            values.append(float(lp["logprob"] if isinstance(lp, dict) else lp))
        return values
