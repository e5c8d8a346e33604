"""labkit.values: every value a case sends crosses the pipe with its exact type."""

from __future__ import annotations

import json

import pytest

from labkit.values import Opaque, decode, encode, same

VALUES = [
    None, True, False, 0, -1, 2**31, 1.5, float("inf"), "", "EVENT 7 5\n", b"", b"EVENT 7 5\n", b"\xa0\xff",
    bytearray(b""), bytearray(b"EVENT 7 5\n"), bytearray(b"\x00\xff"), (1, 2), [1, (2, b"x")], {"a": [1]},
]


@pytest.mark.parametrize("value", VALUES, ids=[repr(v) for v in VALUES])
def test_a_value_comes_back_with_its_exact_type_and_content(value):
    back = decode(json.loads(json.dumps(encode(value))))
    assert type(back) is type(value)
    assert same(back, value)


def test_a_bytearray_is_neither_bytes_nor_an_opaque_wrapper():
    back = decode(encode(bytearray(b"EVENT 7 5\n")))
    assert isinstance(back, bytearray) and not isinstance(back, Opaque)
    assert back == bytearray(b"EVENT 7 5\n")
    assert not same(back, b"EVENT 7 5\n") and not same(b"EVENT 7 5\n", back)
    assert not same(decode(encode(b"EVENT 7 5\n")), back)


def test_bytes_and_bytearray_keep_every_byte_value():
    raw = bytes(range(256))
    assert decode(encode(raw)) == raw
    assert decode(encode(bytearray(raw))) == bytearray(raw)


# --- too_deep: the judge's bound on how deep a child's report may nest ------------------------

def _depth(value) -> int:
    """How deep `value` nests lists and dicts (the definition too_deep must agree with)."""
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


def _json_values():
    from hypothesis import strategies as st

    # Strings full of the characters a bracket scan can trip on: brackets, quotes, backslashes.
    text = st.text(alphabet='[]{}"\\ax\n\u00e9', max_size=6)
    return st.recursive(st.none() | st.integers() | text,
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                        max_leaves=40)


def test_too_deep_agrees_with_the_depth_of_every_json_value():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from labkit.values import too_deep

    @settings(max_examples=400, deadline=None, database=None)
    @given(_json_values(), st.integers(min_value=0, max_value=12), st.booleans())
    def agrees(value, limit, ascii_only):
        line = json.dumps(value, ensure_ascii=ascii_only).encode()
        assert too_deep(line, limit) == (_depth(value) > limit)

    agrees()


@pytest.mark.parametrize(("line", "limit", "deep"), [
    (b"[" * 100_000, 64, True),  # unbalanced and deep: the hostile report that made this bound
    (b"[" * 64 + b"]" * 64, 64, False),
    (b"[" * 65 + b"]" * 65, 64, True),
    (b"[{" * 40 + b"}]" * 40, 64, True),  # alternating kinds count every level
    (b"]" * 100 + b"[" * 100, 64, False),  # never deeper than 0: json.loads refuses it instead
    (b'["' + b"[" * 100 + b'"]', 64, False),  # brackets inside a string do not count
    (b'["\\"' + b"[" * 100 + b'"]', 64, False),  # nor after an escaped quote
])
def test_too_deep_on_unbalanced_and_hostile_lines(line, limit, deep):
    from labkit.values import too_deep

    assert too_deep(line, limit) is deep
