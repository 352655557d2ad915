"""``--set KEY=VALUE`` parsing (``srd_worker.spec.parse_overrides``)."""

from __future__ import annotations

import pytest

from srd_worker.errors import ConfigError
from srd_worker.spec import parse_overrides


def test_values_are_stripped_and_a_later_value_of_a_key_wins() -> None:
    # a script's shared arguments followed by one run's own (tests/unit/cli/test_speculative_cli.py does so)
    assert parse_overrides([" n = 2", "temperature=0.5", "n=3", "stop=a=b"]) == {
        "n": "3",
        "temperature": "0.5",
        "stop": "a=b",
    }
    assert parse_overrides([]) == {}


@pytest.mark.parametrize("pair", ["n", "=3", " =3", ""])
def test_a_pair_without_key_or_equals_sign_is_refused(pair: str) -> None:
    with pytest.raises(ConfigError, match="--set expects key=value"):
        parse_overrides(["n=2", pair])
