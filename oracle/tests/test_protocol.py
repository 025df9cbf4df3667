"""Request parsing and validation (docs/PROTOCOL.md), without a model."""

import pytest

from oracle.protocol import (
    BAD_TOKEN,
    EMPTY_PROMPT,
    MALFORMED,
    OVER_CAPACITY,
    TOO_LONG,
    GenerateRequest,
    Limits,
    ProtocolError,
    VerifyRequest,
    parse_generate,
    parse_line,
    parse_verify,
    validate,
)

GOOD = {"type": "generate", "id": "r", "prompts": [[1, 2]], "max_tokens": 3, "ignore_eos": True, "batch": 1}


@pytest.mark.parametrize("line", ["not json", "[1, 2]", "{\"id\": \"x\"}", "{\"type\": \"generat\"}", "\"str\"", "{"])
def test_malformed_lines(line):
    with pytest.raises(ProtocolError) as e:
        parse_line(line)
    assert e.value.code == MALFORMED and not e.value.fatal


@pytest.mark.parametrize("field,value", [
    ("id", 3), ("prompts", "1,2"), ("prompts", [[1, "2"]]), ("prompts", [1, 2]), ("prompts", []),
    ("prompts", [[True]]), ("max_tokens", 0), ("max_tokens", 1.5), ("max_tokens", True), ("ignore_eos", 1),
    ("batch", 0), ("batch", "4"),
])
def test_mistyped_fields(field, value):
    with pytest.raises(ProtocolError) as e:
        parse_generate({**GOOD, field: value})
    assert e.value.code == MALFORMED
    assert field in e.value.message


@pytest.mark.parametrize("field", ["id", "prompts", "max_tokens", "ignore_eos", "batch"])
def test_missing_fields(field):
    msg = {k: v for k, v in GOOD.items() if k != field}
    with pytest.raises(ProtocolError) as e:
        parse_generate(msg)
    assert e.value.code == MALFORMED and field in e.value.message


@pytest.mark.parametrize("line,field", [
    ('{"type": "generate", "id": "r", "prompts": [[1]], "max_tokens": 2, "ignore_eos": true, "batch": 1, '
     '"temperature": 0.7}', "temperature"),
    ('{"type": "shutdown", "now": true}', "now"),
])
def test_unknown_fields_are_refused_by_name(line, field):
    with pytest.raises(ProtocolError) as e:
        parse_line(line)
    assert e.value.code == MALFORMED and not e.value.fatal
    assert repr(field) in e.value.message


def test_good_request_parses():
    req = parse_generate(GOOD)
    assert req == GenerateRequest("r", [[1, 2]], 3, True, 1)
    validate(req, Limits(vocab_size=3, max_model_len=5))  # 2 + 3 == 5 fits exactly


def _err(prompts, max_tokens=4, limits=Limits(vocab_size=10, max_model_len=8, kv_capacity_tokens=None)):
    with pytest.raises(ProtocolError) as e:
        validate(GenerateRequest("r", prompts, max_tokens, True, 1), limits)
    assert e.value.req_id == "r" and not e.value.fatal
    return e.value


def test_bad_token_names_prompt_position_id_vocab():
    e = _err([[1], [3, 4, 10]])
    assert e.code == BAD_TOKEN
    for part in ("prompt 1", "position 2", "token id 10", "vocab 10"):
        assert part in e.message
    assert _err([[-1]]).code == BAD_TOKEN


def test_empty_prompt_and_too_long_and_over_capacity():
    assert _err([[1], []]).code == EMPTY_PROMPT
    e = _err([[1, 2, 3, 4, 5]], max_tokens=4)
    assert e.code == TOO_LONG and "9" in e.message and "8" in e.message
    e = _err([[1, 2]], max_tokens=4, limits=Limits(vocab_size=10, max_model_len=100, kv_capacity_tokens=5))
    assert e.code == OVER_CAPACITY and "6" in e.message and "5" in e.message


def test_whole_request_validated_before_start():
    # The bad prompt is the last one: the error must still come (and before any generation).
    assert _err([[1], [2], [11]]).code == BAD_TOKEN


VERIFY = {"type": "verify", "id": "v", "prompts": [[1, 2], [3]], "forced": [[4], [5, 6]], "batch": 2}


def test_verify_is_a_request_type():
    assert parse_line('{"type": "verify", "id": "v"}')["type"] == "verify"
    assert parse_verify(VERIFY) == VerifyRequest("v", [[1, 2], [3]], [[4], [5, 6]], 2)


@pytest.mark.parametrize("field,value,says", [
    ("id", 7, "id"), ("prompts", [], "prompts"), ("prompts", [[1, 2.5], [3]], "prompts[0][1]"),
    ("forced", [[4], []], "forced[1] is empty"), ("forced", [[4]], "1 rows for 2 prompts"),
    ("forced", [[4], "5"], "forced[1] is a str"), ("forced", [[4], [True]], "forced[1][0]"),
    ("batch", 0, "batch"), ("batch", None, "batch"),
])
def test_malformed_verify_names_the_field(field, value, says):
    with pytest.raises(ProtocolError) as e:
        parse_verify({**VERIFY, field: value})
    assert e.value.code == MALFORMED and says in e.value.message and not e.value.fatal


@pytest.mark.parametrize("field", ["id", "prompts", "forced", "batch"])
def test_verify_missing_fields(field):
    with pytest.raises(ProtocolError) as e:
        parse_verify({k: v for k, v in VERIFY.items() if k != field})
    assert e.value.code == MALFORMED and field in e.value.message


def _verr(prompts, forced, limits=Limits(vocab_size=10, max_model_len=8, kv_capacity_tokens=6)):
    with pytest.raises(ProtocolError) as e:
        validate(VerifyRequest("v", prompts, forced, 1), limits)
    assert e.value.req_id == "v" and not e.value.fatal
    return e.value


def test_verify_validated_like_generate_with_max_tokens_the_forced_length():
    limits = Limits(vocab_size=10, max_model_len=8, kv_capacity_tokens=None)
    validate(VerifyRequest("v", [[1, 2, 3]], [[4, 5, 6, 7, 8]], 1), limits)  # 3 + 5 == 8 fits exactly
    e = _verr([[1, 2, 3]], [[4, 5, 6, 7, 8, 9]], limits)
    assert e.code == TOO_LONG and "6 forced tokens = 9" in e.message and "8" in e.message
    e = _verr([[1], [2, 3]], [[4], [5, 10]])
    assert e.code == BAD_TOKEN and "forced 1, position 1" in e.message and "token id 10" in e.message
    assert _verr([[1], [-2]], [[4], [5]]).code == BAD_TOKEN
    assert _verr([[1], []], [[4], [5]]).code == EMPTY_PROMPT
    e = _verr([[1, 2]], [[3, 4, 5, 6, 7]])
    assert e.code == OVER_CAPACITY and "7 KV tokens" in e.message and "holds 6" in e.message
