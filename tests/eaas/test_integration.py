"""Real expert-server processes on loopback. Every fleet is stopped by the ``fleet`` fixture."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs the eaas extra: pip install tokenomy[eaas]")
zmq = pytest.importorskip("zmq", reason="needs the eaas extra: pip install tokenomy[eaas]")

from tokenomy.eaas.balance import naive_placement
from tokenomy.eaas.config import MoEConfig, preset
from tokenomy.eaas.layers import LocalMixer, reference_stack
from tokenomy.eaas.moe import MoEWeights, reference_forward
from tokenomy.eaas.protocol import MsgType, decode, encode_control, encode_tensor
from tokenomy.eaas.registry import ServerState
from tokenomy.eaas.stream import StreamEvent, run_stream

from .conftest import Fleet, client_for, registry_for

pytestmark = pytest.mark.integration
SERVERS = ["s0", "s1", "s2"]


def _x(cfg: MoEConfig, n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, cfg.hidden, generator=torch.Generator().manual_seed(seed))


def test_forward_equals_monolithic_and_overlap_equals_serial(fleet: Fleet, cfg: MoEConfig,
                                                              weights: MoEWeights) -> None:
    servers = fleet(naive_placement(cfg.n_experts, SERVERS, replicas=2))
    client = client_for(weights, registry_for(servers))
    for n in (1, 7, 64):
        torch.testing.assert_close(client.forward(_x(cfg, n, n)), reference_forward(weights, _x(cfg, n, n)),
                                   atol=1e-5, rtol=0)
    mixer = LocalMixer.from_seed(cfg.hidden, 32)
    x = _x(cfg, 24)
    ref = reference_stack(weights, mixer, x, n_layers=3)
    for overlap in (False, True):
        torch.testing.assert_close(client.forward_layers(x, 3, mixer, overlap), ref, atol=1e-5, rtol=0)
    client.close()


def test_bad_frames_over_the_wire_get_error_replies_and_the_server_keeps_serving(
    fleet: Fleet, cfg: MoEConfig, weights: MoEWeights
) -> None:
    (server,) = fleet({"only": [0, 1]})
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    sock.connect(server.address)
    try:
        cases = [(b"\x00garbage", "malformed_frame"),
                 (encode_tensor(MsgType.EXPERT_REQUEST, 2, 5, torch.zeros(2, cfg.hidden)), "unknown_expert"),
                 (encode_tensor(MsgType.EXPERT_REQUEST, 3, 0, torch.zeros(2, cfg.hidden + 1)), "shape_mismatch")]
        for data, code in cases:
            sock.send(data)
            reply = decode(sock.recv())
            assert reply.msg_type is MsgType.ERROR and reply.info["code"] == code
        x = _x(cfg, 4)
        sock.send(encode_tensor(MsgType.EXPERT_REQUEST, 4, 1, x))
        ok = decode(sock.recv())
        assert ok.tensor is not None
        torch.testing.assert_close(ok.tensor, weights.experts[1](x))
        sock.send(encode_control(MsgType.PING, 5, {}))
        assert decode(sock.recv()).info["served_requests"] == 1
    finally:
        sock.close()


def test_sigkill_mid_stream_loses_and_corrupts_no_token_then_recovery_gets_traffic(
    fleet: Fleet, cfg: MoEConfig, weights: MoEWeights
) -> None:
    placement = naive_placement(cfg.n_experts, SERVERS, replicas=2)
    servers = fleet(placement)
    reg = registry_for(servers)
    client = client_for(weights, reg, timeout_s=1.0)
    victim = servers[0]
    res = run_stream(client, weights, duration_s=1.5, batch_tokens=16,
                     events=(StreamEvent(0.5, "kill", victim.kill),))
    assert res.tokens_done > 0 and res.events
    assert (res.lost_tokens, res.wrong_tokens) == (0, 0)
    assert client.stats.failovers >= 1
    assert [s.state for s in reg.servers() if s.server_id == victim.server_id] == [ServerState.FAILED]
    # Recovery: a new process for the same experts registers and gets traffic; nothing restarts.
    (back,) = fleet({victim.server_id: placement[victim.server_id]})
    reg.register(back.server_id, back.address, back.expert_ids)
    before = reg.server_tokens[victim.server_id]
    x = _x(cfg, 64, 9)
    for _ in range(4):
        torch.testing.assert_close(client.forward(x), reference_forward(weights, x), atol=1e-5, rtol=0)
    assert reg.server_tokens[victim.server_id] > before
    client.close()


def test_a_hung_server_times_out_and_its_groups_move_to_a_replica(
    fleet: Fleet, cfg: MoEConfig, weights: MoEWeights
) -> None:
    servers = fleet(naive_placement(cfg.n_experts, ["s0", "s1"], replicas=2))
    reg = registry_for(servers)
    client = client_for(weights, reg, timeout_s=0.3)
    x = _x(cfg, 32)
    client.forward(x)  # connect to both
    os.kill(servers[0].pid, signal.SIGSTOP)  # alive but silent: only the timeout can tell
    try:
        t0 = time.monotonic()
        for _ in range(2):  # replicas take turns, so within two batches s0 is asked
            torch.testing.assert_close(client.forward(x), reference_forward(weights, x), atol=1e-5, rtol=0)
        assert 0.3 <= time.monotonic() - t0 < 3.0  # one timeout, then the replica answers
        assert client.stats.failovers >= 1
        assert [s.state for s in reg.servers() if s.server_id == "s0"] == [ServerState.FAILED]
    finally:
        os.kill(servers[0].pid, signal.SIGCONT)
        client.close()


def test_scale_out_gets_traffic_and_drain_then_remove_loses_nothing(
    fleet: Fleet, cfg: MoEConfig, weights: MoEWeights
) -> None:
    servers = fleet({"s0": range(cfg.n_experts), "s1": range(cfg.n_experts)})
    reg = registry_for(servers)
    client = client_for(weights, reg)
    x = _x(cfg, 48)
    client.forward(x)
    (new,) = fleet({"s2": range(cfg.n_experts)})
    reg.register(new.server_id, new.address, new.expert_ids)  # scale out at runtime
    for _ in range(3):  # replicas take turns: within three batches every expert used each server once
        torch.testing.assert_close(client.forward(x), reference_forward(weights, x), atol=1e-5, rtol=0)
    assert reg.server_tokens["s2"] > 0
    # Scale in: in-flight work finishes on the draining server, new work avoids it.
    pending = client.submit(x)
    reg.drain("s0")
    drained_at = reg.server_tokens["s0"]
    torch.testing.assert_close(pending.result(), reference_forward(weights, x), atol=1e-5, rtol=0)
    res = run_stream(client, weights, duration_s=0.5, batch_tokens=16, seed=3)
    assert (res.lost_tokens, res.wrong_tokens) == (0, 0) and res.tokens_done > 0
    assert reg.server_tokens["s0"] == drained_at
    reg.deregister("s0")
    servers[0].stop()
    res = run_stream(client, weights, duration_s=0.3, batch_tokens=16, seed=4)
    assert (res.lost_tokens, res.wrong_tokens, client.stats.failovers) == (0, 0, 0)
    client.close()


def test_servers_load_weights_from_a_local_safetensors_file_over_ipc(fleet: Fleet, tmp_path: Path) -> None:
    cfg = preset("mixtral-tiny")
    w = MoEWeights.from_seed(cfg, 123)
    path = tmp_path / "mixtral-tiny.safetensors"
    w.save_safetensors(path)
    servers = fleet({"a": range(4), "b": range(4, 8)}, preset="mixtral-tiny", weights=path,
                    bind=f"ipc://{tmp_path}/{{server_id}}.sock")
    assert [s.address for s in servers] == [f"ipc://{tmp_path}/a.sock", f"ipc://{tmp_path}/b.sock"]
    client = client_for(w, registry_for(servers))
    x = _x(cfg, 20)
    torch.testing.assert_close(client.forward(x), reference_forward(w, x), atol=1e-5, rtol=0)
    client.close()


def test_a_server_that_cannot_start_reports_why(fleet: Fleet) -> None:
    with pytest.raises(RuntimeError, match="out of range"):
        fleet({"bad": [99]})
    with pytest.raises(ValueError, match="server_id"):
        fleet({"a": [0], "b": [1]}, bind="ipc:///tmp/shared.sock")


def test_overlap_experiment_reports_both_figures_and_stays_exact() -> None:
    from tokenomy.eaas.overlap import OverlapConfig, run_overlap

    r = run_overlap(OverlapConfig(rtt_delay_s=0.002, n_layers=2, batch_tokens=32, mixer_width=64, iterations=2))
    assert r.max_abs_err <= 1e-5
    assert r.exposed_comm_s_serial > 0 and r.exposed_comm_s_overlap >= 0
    assert set(r.to_json()) >= {"exposed_comm_s_serial", "exposed_comm_s_overlap", "hidden_fraction"}
