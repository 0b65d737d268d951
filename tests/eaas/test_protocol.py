from __future__ import annotations

import struct

import pytest

torch = pytest.importorskip("torch", reason="needs the eaas extra: pip install tokenomy[eaas]")

from tokenomy.eaas.protocol import (
    HEADER_BYTES,
    FrameError,
    MsgType,
    decode,
    encode_control,
    encode_error,
    encode_tensor,
    split_bundle,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 8), (0, 8), (2, 3, 4)])
def test_tensor_frames_round_trip_bit_exactly(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    t = torch.randn(shape).to(dtype)
    f = decode(encode_tensor(MsgType.EXPERT_REQUEST, 42, 7, t))
    assert (f.msg_type, f.request_id, f.expert_id) == (MsgType.EXPERT_REQUEST, 42, 7)
    assert f.tensor is not None and f.tensor.dtype == dtype and torch.equal(f.tensor, t)


def test_control_frames_carry_json() -> None:
    f = decode(encode_error(9, "unknown_expert", "no expert 99", expert_id=99))
    assert f.msg_type is MsgType.ERROR and f.info == {"code": "unknown_expert", "message": "no expert 99"}
    assert decode(encode_control(MsgType.PING, 1, {})).info == {}


def test_unsupported_dtype_is_refused_at_encode() -> None:
    with pytest.raises(FrameError, match="not supported"):
        encode_tensor(MsgType.EXPERT_REQUEST, 1, 0, torch.zeros(2, dtype=torch.int64))


_GOOD = encode_tensor(MsgType.EXPERT_REQUEST, 5, 1, torch.zeros(2, 4))


def _patched(offset: int, fmt: str, value: int) -> bytes:
    data = bytearray(_GOOD)
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "shorter than"),
        (b"XXXX" + _GOOD[4:], "bad magic"),
        (_patched(4, "<B", 9), "unsupported protocol version"),
        (_patched(5, "<B", 77), "bad header field"),
        (_patched(6, "<B", 99), "bad header field"),
        (_patched(7, "<B", 9), "ndim 9 exceeds"),
        (_GOOD[:-4], "header announces"),
        (_patched(HEADER_BYTES, "<I", 3), "needs"),  # shape says 3 rows, payload holds 2
        (encode_control(MsgType.PING, 1, {})[:-1] + b"x", "header announces|not JSON"),
        (_GOOD[:HEADER_BYTES - 4] + struct.pack("<I", 2) + b"[]", "header announces"),
    ],
)
def test_malformed_frames_raise_a_clear_frame_error(data: bytes, message: str) -> None:
    with pytest.raises(FrameError, match=message):
        decode(data)


def test_control_payload_must_be_a_json_object() -> None:
    bad = encode_control(MsgType.PING, 1, {})
    body = b"[1]"
    bad = bad[:HEADER_BYTES - 4] + struct.pack("<I", len(body)) + body
    with pytest.raises(FrameError, match="JSON object"):
        decode(bad)


def test_bundles_split_into_their_frames_and_reject_truncation() -> None:
    a = encode_tensor(MsgType.EXPERT_REQUEST, 1, 0, torch.ones(1, 4))
    b = encode_error(2, "x", "y")
    assert split_bundle(a + b) == [a, b]
    with pytest.raises(FrameError, match="only"):
        split_bundle(a + b[:-1])
    with pytest.raises(FrameError, match="empty"):
        split_bundle(b"")
