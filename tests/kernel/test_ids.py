"""Ids are DNS-1123 labels; anything else is refused with a message naming the field."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlslice import InvalidArgumentError
from rlslice._ids import is_valid_id, validate_id


@pytest.mark.parametrize("good", ["a", "grpo-7b", "x" * 63, "0", "a-b-c"])
def test_labels_are_accepted(good: str) -> None:
    assert validate_id(good, "job") == good


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ("", "must not be empty"),
        ("x" * 64, "64 characters"),
        ("Upper", "not a DNS-1123 label"),
        ("-lead", "not a DNS-1123 label"),
        ("trail-", "not a DNS-1123 label"),
        ("under_score", "not a DNS-1123 label"),
        ("dot.ted", "not a DNS-1123 label"),
        ("ünï", "not a DNS-1123 label"),
        ("grpo\n", "not a DNS-1123 label"),
        ("\ngrpo", "not a DNS-1123 label"),
        (7, "must be a string"),
    ],
)
def test_non_labels_are_refused_naming_the_field(bad: object, fragment: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        validate_id(bad, "group")
    assert str(raised.value).startswith("group: ")
    assert fragment in str(raised.value)
    assert "\n" not in str(raised.value)


@given(st.text(max_size=80))
def test_validate_and_is_valid_agree(text: str) -> None:
    try:
        validate_id(text, "job")
        accepted = True
    except InvalidArgumentError:
        accepted = False
    assert accepted == is_valid_id(text)
