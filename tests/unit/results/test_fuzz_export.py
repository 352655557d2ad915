"""Fuzz: what reads model output outside the rewards and tasks.

- Export cells (CSV / Parquet flattening): a response with control characters, NUL bytes, CR/LF, mixed
  scripts or a huge size round-trips exactly through both formats.
- The PRM step splitter: steps are non-empty pieces of the response (or one step, possibly empty).
- The engines' token budget: a prompt that fills the context is an ``EngineError``, never a
  non-positive budget.
"""

from __future__ import annotations

import csv
import io

import pyarrow.parquet as pq
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from srd_worker.engines.base import GenerationRequest, SamplingParams, token_budget
from srd_worker.errors import EngineError
from srd_worker.results.export import encode_csv, encode_flat_parquet
from srd_worker.rewards.hf_prm import split_steps
from tests.unit.test_fuzz_strategies import hostile_text


def _rows(response: str, extra: str) -> list[dict]:
    return [
        {"item_id": "a", "response": response, "correct": True, "reward": 0.5, "extra": {"note": extra}},
        {"item_id": "b", "response": extra, "correct": None, "reward": None, "extra": {"note": response}},
    ]


@given(response=hostile_text(), extra=st.text(max_size=50))
@example(response="\x00" * 5 + "\r\n\r" + "é" * 3, extra='"quoted", \x00')
@example(response="x" * 1_000_000, extra="")  # a huge cell
def test_csv_cells_round_trip(response, extra):
    data = encode_csv(_rows(response, extra))
    # Python's csv reader refuses fields over 128 KiB by default: a reader of a huge cell must raise it.
    limit = csv.field_size_limit(2**31 - 1)
    try:
        table = list(csv.DictReader(io.StringIO(data.decode("utf-8"), newline="")))
    finally:
        csv.field_size_limit(limit)
    assert [r["response"] for r in table] == [response, extra]
    assert [r["extra.note"] for r in table] == [extra, response]
    assert [r["correct"] for r in table] == ["true", ""]


@given(response=hostile_text(), extra=st.text(max_size=50))
@example(response="\x00\x01\x1b" * 100, extra="\ufeff")
@example(response="y" * 1_000_000, extra="\r")
def test_parquet_cells_round_trip(response, extra):
    table = pq.read_table(io.BytesIO(encode_flat_parquet(_rows(response, extra)))).to_pylist()
    assert [r["response"] for r in table] == [response, extra]
    assert [r["extra.note"] for r in table] == [extra, response]
    assert [r["reward"] for r in table] == [0.5, None]


@given(response=hostile_text(), sep=st.sampled_from(["\n\n", "\n", "\x00", "ки"]), finished=st.booleans())
def test_split_steps(response, sep, finished):
    steps = split_steps(response, sep, finished=finished)
    assert steps and all(isinstance(s, str) for s in steps)
    if len(steps) > 1 or steps[0].strip():
        assert all(s.strip() and s in response for s in steps)
    else:
        assert steps == [""]  # no text at all: one empty step
    assert len(steps) <= response.count(sep) + 1


@given(
    prompt_len=st.integers(0, 5000),
    max_context=st.integers(1, 4096),
    max_new=st.integers(0, 10**6),
)
def test_token_budget(prompt_len, max_context, max_new):
    request = GenerationRequest(prompt_ids=(1,) * prompt_len, params=SamplingParams(max_new_tokens=max_new))
    if prompt_len == 0 or prompt_len >= max_context:
        with pytest.raises(EngineError, match="request 3"):
            token_budget(3, request, max_context)
    else:
        budget = token_budget(3, request, max_context)
        assert budget == min(max_new, max_context - prompt_len)
        assert 0 <= budget and prompt_len + budget <= max_context
