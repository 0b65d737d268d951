"""Expert server: a stateless process that applies expert e to a batch of hidden states.

Run as ``python -m tokenomy.eaas.server --bind tcp://127.0.0.1:0 --experts 0-7`` (or ``tokenomy eaas
serve``); the experts come from a block preset and seed, a block's safetensors file (``--weights``) or
a model's expert checkpoint (``--expert-file``, see ``checkpoint.py``; ``--experts`` then picks keys,
all of them if left out). It binds a ZeroMQ ROUTER socket, prints one line ``READY <address> <server_id> <experts>``
on stdout once it serves (``:0`` picks a free port; the line carries the real one) and then answers
frames until SIGTERM/SIGINT. Nothing is kept between requests, so any replica can answer any request.

Bad requests (malformed frame, unknown expert, wrong shape or dtype) get an ERROR frame with a
machine-readable ``code`` and the server keeps serving.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import zmq
from safetensors import SafetensorError

from tokenomy.eaas.checkpoint import load_experts
from tokenomy.eaas.config import MoEConfig, preset
from tokenomy.eaas.moe import ExpertWeights, MoEWeights
from tokenomy.eaas.protocol import (
    Frame,
    FrameError,
    MsgType,
    decode,
    encode_control,
    encode_error,
    encode_tensor,
    peek_request_id,
    split_bundle,
)
from tokenomy.eaas.server_args import build_parser


def parse_expert_ids(spec: str) -> list[int]:
    """Parse ``"0-3,8,10-11"`` into sorted unique ids; raise ValueError on anything else."""
    ids: set[int] = set()
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        lo, sep, hi = part.partition("-")
        try:
            first, last = (int(lo), int(hi)) if sep else (int(lo), int(lo))
        except ValueError:
            raise ValueError(f"bad expert id range {part!r} in {spec!r}; use e.g. 0-7,9") from None
        if first < 0 or last < first:
            raise ValueError(f"bad expert id range {part!r} in {spec!r}")
        ids.update(range(first, last + 1))
    if not ids:
        raise ValueError(f"no expert ids in {spec!r}")
    return sorted(ids)


@dataclass
class ExpertHandler:
    """Pure request handling (no sockets): frame bytes in, reply bytes out. Counts what it served."""

    server_id: str
    hidden: int
    experts: dict[int, ExpertWeights]
    served_requests: int = 0
    served_tokens: dict[int, int] = field(default_factory=dict)

    def handle_message(self, data: bytes) -> bytes:
        """Answer a bundle of frames with a bundle of replies, in order; a bundle that cannot even be
        split gets one ``malformed_frame`` error."""
        try:
            frames = split_bundle(data)
        except FrameError as exc:
            return encode_error(peek_request_id(data), "malformed_frame", str(exc))
        return b"".join(self.handle(f) for f in frames)

    def handle(self, data: bytes) -> bytes:
        try:
            frame = decode(data)
        except FrameError as exc:
            return encode_error(peek_request_id(data), "malformed_frame", str(exc))
        if frame.msg_type is MsgType.PING:
            info = {"server_id": self.server_id, "experts": sorted(self.experts),
                    "served_requests": self.served_requests,
                    "served_tokens": {str(k): v for k, v in sorted(self.served_tokens.items())}}
            return encode_control(MsgType.PONG, frame.request_id, info)
        if frame.msg_type is not MsgType.EXPERT_REQUEST:
            return encode_error(frame.request_id, "bad_msg_type", f"server does not accept {frame.msg_type.name}")
        return self._apply(frame)

    def _apply(self, frame: Frame) -> bytes:
        rid, eid, x = frame.request_id, frame.expert_id, frame.tensor
        assert x is not None  # decode guarantees a tensor on EXPERT_REQUEST
        expert = self.experts.get(eid)
        if expert is None:
            return encode_error(rid, "unknown_expert",
                                f"server {self.server_id} does not host expert {eid}; hosts {sorted(self.experts)}",
                                eid)
        if x.ndim != 2 or x.shape[1] != self.hidden:
            return encode_error(rid, "shape_mismatch",
                                f"expected hidden states [tokens, {self.hidden}], got {list(x.shape)}", eid)
        with torch.no_grad():
            y = expert(x.to(torch.float32)).to(x.dtype)
        self.served_requests += 1
        self.served_tokens[eid] = self.served_tokens.get(eid, 0) + x.shape[0]
        return encode_tensor(MsgType.EXPERT_REPLY, rid, eid, y)


def zmq_bind_address(address: str) -> str:
    """Map ``tcp://host:0`` (any free port) to ZeroMQ's ``tcp://host:*``."""
    return address[:-2] + ":*" if address.startswith("tcp://") and address.endswith(":0") else address


def check_bind(address: str) -> str:
    """``address`` if it is ``tcp://HOST:PORT`` (0 <= PORT <= 65535; 0 = any free port) or
    ``ipc://PATH``; otherwise ValueError naming ``--bind``. ZeroMQ itself would accept
    ``tcp://host:99999`` and listen elsewhere."""
    if address.startswith("ipc://") and len(address) > len("ipc://"):
        return address
    if address.startswith("tcp://"):
        host, _, port = address[len("tcp://"):].rpartition(":")
        if host and port.isdigit() and 0 <= int(port) <= 65535:
            return address
        raise ValueError(f"--bind {address}: expected tcp://HOST:PORT with PORT in 0..65535 (0: any free port)")
    raise ValueError(f"--bind {address}: expected tcp://HOST:PORT or ipc://PATH")


def serve(handler: ExpertHandler, bind: str, out: object = sys.stdout) -> None:
    """Bind and answer frames until SIGTERM/SIGINT; prints the READY line first.

    Raises ValueError naming ``--bind`` for a malformed address or one that cannot be bound."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.bind(zmq_bind_address(check_bind(bind)))
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        ctx.term()
        raise ValueError(f"--bind {bind}: cannot bind ({exc.strerror})") from None
    address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    experts = ",".join(map(str, sorted(handler.experts)))
    print(f"READY {address} {handler.server_id} {experts}", file=out, flush=True)  # type: ignore[call-overload]
    try:
        while not stopping:
            # Short poll so a signal is noticed promptly; the loop is idle-cheap.
            if not sock.poll(100):
                continue
            identity, data = sock.recv_multipart(copy=True)[:2]
            sock.send_multipart([identity, handler.handle_message(data)])
    finally:
        sock.close(linger=0)
        ctx.term()


def run_from_args(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)  # many servers share few cores: avoid oversubscription
    if args.expert_file is None and args.experts is None:
        raise ValueError("--experts is required (without --expert-file)")
    check_bind(args.bind)  # before loading weights: a typo should not wait for them
    hidden, experts = _load(args)
    server_id = args.server_id or f"server-{os.getpid()}"
    serve(ExpertHandler(server_id, hidden, experts), args.bind)
    return 0


def _load(args: argparse.Namespace) -> tuple[int, dict[int, ExpertWeights]]:
    """Hidden size and the hosted experts, from an expert checkpoint or a block preset."""
    ids = parse_expert_ids(args.experts) if args.experts is not None else None
    if args.expert_file is not None:
        try:
            return load_experts(args.expert_file, ids)
        except SafetensorError as exc:
            raise ValueError(f"--expert-file {args.expert_file}: not a readable safetensors file ({exc})") from None
    assert ids is not None
    cfg: MoEConfig = preset(args.preset)
    if ids[-1] >= cfg.n_experts:
        raise ValueError(f"expert id {ids[-1]} out of range: preset {args.preset} has {cfg.n_experts} experts")
    try:
        weights = (MoEWeights.from_safetensors(cfg, args.weights, ids) if args.weights
                   else MoEWeights.from_seed(cfg, args.seed, ids))
    except SafetensorError as exc:
        raise ValueError(f"--weights {args.weights}: not a readable safetensors file ({exc})") from None
    return cfg.hidden, weights.experts


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run_from_args(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"eaas server: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
