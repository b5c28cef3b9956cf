"""Embeddings as the APIs promise them (compat/embeddings.py) and Ollama's truncation of the tokens
(server/embed_truncation.py): shortening, normalising, base64, and the refusals in OpenAI's words."""

from __future__ import annotations

import base64
import json
import math
import struct
from typing import Any

import pytest

from modelrunner.compat.embeddings import Shortening, normalised, shortened
from modelrunner.errors import BadRequest
from modelrunner.server.embed_truncation import NOTHING_LEFT, cut


def norm(vector: list[float]) -> float:
    return math.sqrt(sum(v * v for v in vector))


def test_shortened_keeps_the_first_values_renormalised() -> None:
    vector = normalised([3.0, 4.0, 12.0])
    assert shortened(vector, 2) == pytest.approx([0.6, 0.8])
    assert shortened(vector, 3) == vector and shortened(vector, 9) == vector
    assert normalised([0.0, 0.0]) == [0.0, 0.0]  # nothing to scale; no division by zero


@pytest.mark.parametrize(
    ("doc", "param", "words"),
    [
        ({"dimensions": 0}, "dimensions", "Expected a value >= 1, but got 0"),
        ({"dimensions": -3}, "dimensions", "Expected a value >= 1, but got -3"),
        ({"dimensions": "8"}, "dimensions", "expected an integer, but got a string"),
        ({"dimensions": 8.5}, "dimensions", "expected an integer, but got a decimal"),
        ({"dimensions": True}, "dimensions", "expected an integer, but got a boolean"),
        ({"dimensions": 8, "encoding_format": "int8"}, "encoding_format", "'float' and 'base64'"),
    ],
)
def test_bad_dimensions_are_refused_in_openai_words(doc: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(BadRequest) as refused:
        Shortening.of({"model": "m", "input": "x", **doc})
    assert refused.value.param == param and words in refused.value.message


def test_the_engine_is_asked_for_whole_float_vectors() -> None:
    doc = {"model": "m", "input": "x", "dimensions": 2, "encoding_format": "base64"}
    assert Shortening.of({"model": "m"}) is None and Shortening.of({"dimensions": None}) is None
    shortening = Shortening.of(doc)
    assert shortening == Shortening(2, base64=True)
    assert shortening.engine_request(doc) == {"model": "m", "input": "x"}


def engine_answer(*vectors: list[float]) -> dict[str, Any]:
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
    return {"object": "list", "data": data, "usage": {"prompt_tokens": 2, "total_tokens": 2}}


def test_answers_are_shortened_as_floats_or_base64() -> None:
    answer = engine_answer(normalised([3.0, 4.0, 12.0]), normalised([1.0, 0.0, 1.0]))
    floats = Shortening(2, base64=False).answer(answer)
    assert [item["embedding"] for item in floats["data"]] == [pytest.approx([0.6, 0.8]), [1.0, 0.0]]
    assert floats["usage"] == answer["usage"] and [item["index"] for item in floats["data"]] == [0, 1]
    encoded = json.loads(Shortening(2, base64=True).answer_bytes(json.dumps(answer).encode()))
    decoded = struct.unpack("<2f", base64.b64decode(encoded["data"][0]["embedding"]))
    assert decoded == pytest.approx([0.6, 0.8]) and norm(list(decoded)) == pytest.approx(1.0)


def test_dimensions_beyond_the_models_size_are_refused() -> None:
    with pytest.raises(BadRequest) as refused:
        Shortening(4, base64=False).answer(engine_answer([0.0, 1.0, 0.0]))
    message = refused.value.message
    assert (
        refused.value.param == "dimensions"
        and "Expected a value <= 3 (the model" in message
        and "got 4" in message
    )


def test_an_answer_that_is_not_json_is_passed_on() -> None:
    assert Shortening(2, base64=False).answer_bytes(b"not json") == b"not json"


@pytest.mark.parametrize(
    ("with_special", "plain", "limit", "expected"),
    [
        ([1, 5, 6, 7, 8], [5, 6, 7, 8], 3, [1, 5, 6]),  # BOS kept, the text's end cut
        ([1, 5, 6, 7, 8, 2], [5, 6, 7, 8], 4, [1, 5, 6, 2]),  # BOS and EOS/SEP kept
        ([5, 6, 7, 2], [5, 6, 7], 2, [5, 2]),  # EOS only
        ([5, 6, 7], [5, 6, 7], 2, [5, 6]),  # no special tokens
    ],
)
def test_cut_keeps_the_special_tokens(
    with_special: list[int], plain: list[int], limit: int, expected: list[int]
) -> None:
    assert cut(with_special, plain, limit) == expected


def test_cut_to_nothing_but_special_tokens_is_refused() -> None:
    with pytest.raises(BadRequest, match=NOTHING_LEFT):
        cut([1, 5, 6, 2], [5, 6], 2)
