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
