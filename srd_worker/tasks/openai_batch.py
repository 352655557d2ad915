"""OpenAI batch files as input: JSON Lines requests of the OpenAI Batch API, run offline by srdq.

Each line is ``{"custom_id": ..., "method": "POST", "url": "/v1/chat/completions", "body": {...}}``
(https://platform.openai.com/docs/guides/batch). ``body.messages`` (chat: ``role`` system, developer,
user or assistant; ``content`` text or a list of ``{"type": "text", "text": ...}`` parts) goes through the
model's chat template; ``body.prompt`` (``/v1/completions``: one string) is sent as a plain prompt. The
item id is the ``custom_id`` (unique, non-empty), and every result record carries it as ``custom_id``, so
the output (``results.jsonl``, ``srdq export``) joins back to the requests. The item's ``question`` (what
reward models and judges read) is the last user message, or the prompt.

Nothing is graded (there is no gold answer): ``correct`` is null; score by reward and length, or export.
Generation is the method's (``--method``, ``--n``, ``--max-new-tokens``, ``--set``): the body's ``model``,
``max_tokens``, ``temperature``, ``n`` and other sampling fields are ignored, not an error.

Left out: images and other non-text content parts (refused, naming the line), tools / function calls,
``response_format``, the embeddings endpoint, and writing an OpenAI batch *output* file.
"""

from __future__ import annotations

from typing import Any

from srd_worker.tasks.base import Item
from srd_worker.tasks.loading import Rows, RowTask

GRADER_VERSION: str = "ungraded-1"
URLS: tuple[str, ...] = ("/v1/chat/completions", "/v1/completions")
ROLES: dict[str, str] = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def is_openai_batch_row(row: dict[str, Any]) -> bool:
    """True for a row of an OpenAI batch file (``custom_id`` and ``body``)."""
    return "custom_id" in row and "body" in row


class OpenAIBatchTask(RowTask):
    """The requests of an OpenAI batch file, ungraded, ``custom_id`` carried to the records."""

    name: str = "openai_batch"
    required_fields: tuple[str, ...] = ("custom_id", "body")
    grader_version: str = GRADER_VERSION

    def _item(self, rows: Rows, at: int, row: dict[str, Any]) -> Item:
        rows.require(at, row, ("custom_id",))
        custom_id = row["custom_id"]  # exactly as given: the output joins back on it
        method = row.get("method", "POST")
        if method != "POST":
            raise rows.error(f"must be POST, got {method!r}", at, "method")
        url = row.get("url", URLS[0])
        if url not in URLS:
            raise rows.error(f"must be one of {', '.join(URLS)}, got {url!r}", at, "url")
        body = row.get("body")
        if not isinstance(body, dict):
            raise rows.error("must be a JSON object with messages or prompt", at, "body")
        meta: dict[str, Any] = {rows.unit: at, "custom_id": custom_id}
        if ("messages" in body) == ("prompt" in body):
            raise rows.error("needs exactly one of messages (chat) or prompt (completions)", at, "body")
        if "prompt" in body:
            prompt = body["prompt"]
            if isinstance(prompt, list) and len(prompt) == 1:
                prompt = prompt[0]
            if not isinstance(prompt, str) or not prompt.strip():
                raise rows.error("must be one non-empty string", at, "body.prompt")
            meta["prompt"] = prompt
            question = prompt
        else:
            messages = self._messages(rows, at, body["messages"])
            meta["messages"] = messages
            users = [m["content"] for m in messages if m["role"] == "user"]
            question = users[-1] if users else messages[-1]["content"]
        return Item(id=custom_id, question=question, gold="", meta=meta)

    @staticmethod
    def _messages(rows: Rows, at: int, messages: Any) -> list[dict[str, str]]:
        if not isinstance(messages, list) or not messages:
            raise rows.error("must be a non-empty list of messages", at, "body.messages")
        out = []
        for i, message in enumerate(messages):
            where = f"body.messages[{i}]"
            if not isinstance(message, dict):
                raise rows.error("must be an object with role and content", at, where)
            raw_role = message.get("role")
            role = ROLES.get(raw_role) if isinstance(raw_role, str) else None
            if role is None:
                raise rows.error(
                    f"role must be one of {', '.join(ROLES)}, got {message.get('role')!r}", at, where
                )
            content = message.get("content")
            if isinstance(content, list):
                parts = []
                for part in content:
                    if (
                        not isinstance(part, dict)
                        or part.get("type") != "text"
                        or not isinstance(part.get("text"), str)
                    ):
                        raise rows.error("only text content parts are supported", at, f"{where}.content")
                    parts.append(part["text"])
                content = "\n".join(parts)
            if not isinstance(content, str):
                raise rows.error("content must be text", at, f"{where}.content")
            out.append({"role": role, "content": content})
        return out

    def messages(self, item: Item) -> list[dict[str, str]]:
        if "messages" in item.meta:
            return [dict(m) for m in item.meta["messages"]]
        return [{"role": "user", "content": item.meta.get("prompt", item.question)}]

    def prompt_ids(self, tokenizer: Any, item: Item) -> list[int]:
        """A completions request's prompt as plain text; chat messages through the model's template."""
        if "prompt" in item.meta:
            return list(tokenizer.encode(item.meta["prompt"]))
        return list(tokenizer.chat_prompt_ids(self.messages(item)))

    def record_fields(self, item: Item) -> dict[str, Any]:
        """Added to the item's result record: its ``custom_id``."""
        return {"custom_id": item.meta.get("custom_id", item.id)}

    def extract_answer(self, response: str) -> str | None:
        return None

    def grade(self, response: str, item: Item) -> bool | None:
        return None

    def metrics(self, response: str, item: Item) -> dict[str, float]:
        return {}
