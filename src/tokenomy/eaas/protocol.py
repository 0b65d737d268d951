"""Binary wire frames between attention clients and expert servers. No pickle.

Layout (little endian)::

    magic "EAAS" | version u8 | msg_type u8 | dtype u8 | ndim u8 | request_id u64 | expert_id i32
    | payload_bytes u32 | ndim x u32 dims | payload

A wire message is one frame or several frames back to back (a *bundle*: a client sends all of one
server's expert groups in one message, the server answers with a bundle of replies in the same order).

Tensor frames (EXPERT_REQUEST / EXPERT_REPLY) carry raw row-major tensor bytes whose size must equal
prod(dims) * itemsize. Control frames (ERROR, PING, PONG) carry a UTF-8 JSON object with ndim 0.
``decode`` validates everything and raises ``FrameError`` with a message fit to send back to the peer.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import torch

MAGIC = b"EAAS"
VERSION = 1
MAX_NDIM = 4
_HEADER = struct.Struct("<4sBBBBQiI")
HEADER_BYTES = _HEADER.size


class MsgType(IntEnum):
    EXPERT_REQUEST = 1
    EXPERT_REPLY = 2
    ERROR = 3
    PING = 4
    PONG = 5


class WireDType(IntEnum):
    NONE = 0  # control frame: JSON payload
    FLOAT32 = 1
    FLOAT16 = 2
    BFLOAT16 = 3


_TORCH_DTYPES: dict[WireDType, torch.dtype] = {
    WireDType.FLOAT32: torch.float32,
    WireDType.FLOAT16: torch.float16,
    WireDType.BFLOAT16: torch.bfloat16,
}
_WIRE_DTYPES = {v: k for k, v in _TORCH_DTYPES.items()}


class FrameError(ValueError):
    """A frame that cannot be decoded; the message says what is wrong."""


@dataclass(frozen=True)
class Frame:
    """A decoded frame: a tensor (tensor frames) or a JSON object (control frames)."""

    msg_type: MsgType
    request_id: int
    expert_id: int = -1
    tensor: torch.Tensor | None = None
    info: dict[str, Any] = field(default_factory=dict)


def encode_tensor(msg_type: MsgType, request_id: int, expert_id: int, tensor: torch.Tensor) -> bytes:
    """Encode a tensor frame; the tensor is made contiguous and sent in its own dtype."""
    if tensor.dtype not in _WIRE_DTYPES:
        raise FrameError(f"dtype {tensor.dtype} not supported on the wire; use float32/float16/bfloat16")
    if tensor.ndim > MAX_NDIM:
        raise FrameError(f"tensor has {tensor.ndim} dims; at most {MAX_NDIM} allowed")
    t = tensor.detach().contiguous()
    # bfloat16 has no numpy twin: view the raw bytes as uint8 before leaving torch.
    payload = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
    head = _HEADER.pack(MAGIC, VERSION, msg_type, _WIRE_DTYPES[t.dtype], t.ndim, request_id, expert_id,
                        len(payload))
    return head + struct.pack(f"<{t.ndim}I", *t.shape) + payload


def encode_control(msg_type: MsgType, request_id: int, info: dict[str, Any], expert_id: int = -1) -> bytes:
    """Encode a control frame (ERROR / PING / PONG) with a JSON object payload."""
    payload = json.dumps(info, separators=(",", ":")).encode()
    return _HEADER.pack(MAGIC, VERSION, msg_type, WireDType.NONE, 0, request_id, expert_id, len(payload)) + payload


def encode_error(request_id: int, code: str, message: str, expert_id: int = -1) -> bytes:
    """An ERROR reply: ``code`` is machine-readable (e.g. ``unknown_expert``), ``message`` for humans."""
    return encode_control(MsgType.ERROR, request_id, {"code": code, "message": message}, expert_id)


def peek_request_id(data: bytes) -> int:
    """Best-effort request id of a (possibly malformed) frame, 0 if the header is unreadable."""
    if len(data) >= HEADER_BYTES and data[:4] == MAGIC:
        return int(_HEADER.unpack_from(data)[5])
    return 0


def split_bundle(data: bytes) -> list[bytes]:
    """Cut a message into its frames using each header's lengths; raise FrameError if they do not add up."""
    frames: list[bytes] = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < HEADER_BYTES or data[pos:pos + 4] != MAGIC:
            raise FrameError(f"bad frame at byte {pos} of a {len(data)}-byte message (short or bad magic)")
        ndim, n_payload = data[pos + 7], _HEADER.unpack_from(data, pos)[7]
        end = pos + HEADER_BYTES + 4 * ndim + n_payload
        if end > len(data):
            raise FrameError(f"frame at byte {pos} announces {end - pos} bytes, only {len(data) - pos} left")
        frames.append(data[pos:end])
        pos = end
    if not frames:
        raise FrameError("empty message")
    return frames


def decode(data: bytes) -> Frame:
    """Decode and validate one frame; raises FrameError describing the first problem found."""
    if len(data) < HEADER_BYTES:
        raise FrameError(f"frame is {len(data)} bytes, shorter than the {HEADER_BYTES}-byte header")
    magic, version, mtype, dtype, ndim, request_id, expert_id, n_payload = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise FrameError(f"unsupported protocol version {version}, this side speaks {VERSION}")
    try:
        msg_type, wire_dtype = MsgType(mtype), WireDType(dtype)
    except ValueError as exc:
        raise FrameError(f"bad header field: {exc}") from None
    if ndim > MAX_NDIM:
        raise FrameError(f"ndim {ndim} exceeds {MAX_NDIM}")
    dims_end = HEADER_BYTES + 4 * ndim
    if len(data) != dims_end + n_payload:
        raise FrameError(f"frame is {len(data)} bytes, header announces {dims_end + n_payload}")
    payload = data[dims_end:]
    is_tensor = msg_type in (MsgType.EXPERT_REQUEST, MsgType.EXPERT_REPLY)
    if not is_tensor:
        if wire_dtype is not WireDType.NONE or ndim:
            raise FrameError(f"{msg_type.name} frame must carry JSON (dtype NONE, ndim 0)")
        try:
            info = json.loads(payload) if payload else {}
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FrameError(f"{msg_type.name} payload is not JSON: {exc}") from None
        if not isinstance(info, dict):
            raise FrameError(f"{msg_type.name} payload must be a JSON object")
        return Frame(msg_type, request_id, expert_id, info=info)
    if wire_dtype is WireDType.NONE:
        raise FrameError(f"{msg_type.name} frame must carry a tensor dtype")
    shape = struct.unpack_from(f"<{ndim}I", data, HEADER_BYTES)
    torch_dtype = _TORCH_DTYPES[wire_dtype]
    expected = math.prod(shape) * torch_dtype.itemsize
    if n_payload != expected:
        raise FrameError(f"payload is {n_payload} bytes; shape {list(shape)} of {torch_dtype} needs {expected}")
    raw = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if n_payload else torch.empty(0, dtype=torch.uint8)
    return Frame(msg_type, request_id, expert_id, tensor=raw.view(torch_dtype).reshape(shape))
