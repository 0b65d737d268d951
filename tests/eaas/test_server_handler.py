from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs the eaas extra: pip install tokenomy[eaas]")

from tokenomy.eaas.config import MoEConfig
from tokenomy.eaas.moe import MoEWeights
from tokenomy.eaas.protocol import MsgType, decode, encode_control, encode_tensor, split_bundle
from tokenomy.eaas.server import ExpertHandler, parse_expert_ids, zmq_bind_address


@pytest.fixture
def handler(cfg: MoEConfig, weights: MoEWeights) -> ExpertHandler:
    return ExpertHandler("s-test", cfg.hidden, {e: weights.experts[e] for e in (1, 4)})


def _request(expert: int, x: torch.Tensor, rid: int = 1) -> bytes:
    return encode_tensor(MsgType.EXPERT_REQUEST, rid, expert, x)


def test_applies_the_hosted_expert(handler: ExpertHandler, cfg: MoEConfig, weights: MoEWeights) -> None:
    x = torch.randn(6, cfg.hidden)
    reply = decode(handler.handle(_request(4, x, rid=77)))
    assert (reply.msg_type, reply.request_id, reply.expert_id) == (MsgType.EXPERT_REPLY, 77, 4)
    assert reply.tensor is not None
    torch.testing.assert_close(reply.tensor, weights.experts[4](x))


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"garbage", "malformed_frame"),
        (_request(2, torch.zeros(3, 64)), "unknown_expert"),
        (_request(1, torch.zeros(3, 65)), "shape_mismatch"),
        (_request(1, torch.zeros(3, 4, 64)), "shape_mismatch"),
        (encode_tensor(MsgType.EXPERT_REPLY, 1, 1, torch.zeros(1, 64)), "bad_msg_type"),
    ],
)
def test_bad_requests_get_an_error_reply_and_the_server_keeps_serving(
    handler: ExpertHandler, cfg: MoEConfig, data: bytes, code: str
) -> None:
    err = decode(handler.handle_message(data))
    assert err.msg_type is MsgType.ERROR and err.info["code"] == code and err.info["message"]
    ok = decode(handler.handle_message(_request(1, torch.randn(2, cfg.hidden))))
    assert ok.msg_type is MsgType.EXPERT_REPLY


def test_unknown_expert_error_lists_what_the_server_hosts(handler: ExpertHandler) -> None:
    err = decode(handler.handle(_request(9, torch.zeros(1, 64))))
    assert "hosts [1, 4]" in err.info["message"]


def test_a_bundle_is_answered_frame_by_frame_in_order(handler: ExpertHandler, cfg: MoEConfig) -> None:
    bundle = _request(1, torch.randn(2, cfg.hidden), 10) + _request(3, torch.randn(2, cfg.hidden), 11)
    replies = [decode(r) for r in split_bundle(handler.handle_message(bundle))]
    assert [(r.request_id, r.msg_type) for r in replies] == [(10, MsgType.EXPERT_REPLY), (11, MsgType.ERROR)]


def test_ping_reports_identity_and_load(handler: ExpertHandler, cfg: MoEConfig) -> None:
    handler.handle(_request(4, torch.randn(5, cfg.hidden)))
    pong = decode(handler.handle(encode_control(MsgType.PING, 3, {})))
    assert pong.msg_type is MsgType.PONG
    assert pong.info == {"server_id": "s-test", "experts": [1, 4], "served_requests": 1, "served_tokens": {"4": 5}}


@pytest.mark.parametrize(("spec", "ids"), [("0-3", [0, 1, 2, 3]), ("5", [5]), ("0-1, 7,1", [0, 1, 7])])
def test_expert_id_ranges_parse(spec: str, ids: list[int]) -> None:
    assert parse_expert_ids(spec) == ids


@pytest.mark.parametrize("spec", ["", "a-b", "3-1", "-2", "1-"])
def test_bad_expert_id_ranges_are_rejected(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_expert_ids(spec)


def test_port_zero_means_any_free_port() -> None:
    assert zmq_bind_address("tcp://127.0.0.1:0") == "tcp://127.0.0.1:*"
    assert zmq_bind_address("ipc:///tmp/x") == "ipc:///tmp/x"
