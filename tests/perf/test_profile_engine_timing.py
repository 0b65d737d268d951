"""`tokenomy perf profile` times decode steps by the engine's own inter-token histogram when the
target exports vLLM's, so a client that reads a stream late and in one burst (a busy machine)
still measures the engine's step."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from bench.fakes import FakeEngine
from helpers.threaded_http import serve_thread
from tokenomy.bench.profile import ITL_HISTOGRAM, ProfilePlan, histogram_totals, profile

ENGINE_ITL_S = 0.004
"""The step the fake engine reports for every gap (it streams every answer at once)."""


def test_histogram_totals_adds_label_sets_and_ignores_other_names() -> None:
    text = "\n".join([
        "# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.",
        'vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01"} 3.0',
        'vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.25',
        'vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 10.0',
        'vllm:inter_token_latency_seconds_sum{engine="1",model_name="m"} 0.5',
        'vllm:inter_token_latency_seconds_count{engine="1",model_name="m"} 5.0',
        'vllm:inter_token_latency_seconds_created{engine="0"} 1.7e9',
        "vllm:time_to_first_token_seconds_sum 9.0",
    ])
    assert histogram_totals(text, ITL_HISTOGRAM) == (0.75, 15.0)
    assert histogram_totals("vllm:num_requests_running 1.0", ITL_HISTOGRAM) is None


@contextmanager
def _bursty_vllm() -> Iterator[str]:
    """A loopback server answering like vLLM whose every answer arrives in one write, and whose
    ``/metrics`` counts ``ENGINE_ITL_S`` per gap between a request's tokens."""
    engine = FakeEngine()
    itl = {"sum": 0.0, "count": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, ctype: str, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/metrics":
                with lock:
                    text = (f'{ITL_HISTOGRAM}_sum{{engine="0"}} {itl["sum"]}\n'
                            f'{ITL_HISTOGRAM}_count{{engine="0"}} {float(itl["count"])}\n')
                self._send(200, "text/plain", text.encode())
            elif self.path == "/v1/models":
                self._send(200, "application/json", json.dumps({"data": [{"id": "fake-model"}]}).encode())
            else:
                self._send(404, "application/json", b'{"detail": "Not Found"}')

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            if not self.path.startswith("/v1/"):
                self._send(404, "application/json", b'{"detail": "Not Found"}')
                return
            with lock:
                _, words, usage = engine.answer(body)
                itl["sum"] += ENGINE_ITL_S * (len(words) - 1)
                itl["count"] += len(words) - 1
            self._send(200, "text/event-stream", "".join(e for _, e in engine.events(body, words, usage)).encode())

    with serve_thread(Handler) as url:
        yield url


@pytest.mark.integration
def test_decode_steps_are_the_engines_when_the_client_reads_in_bursts() -> None:
    plan = ProfilePlan(prompt_tokens=(16, 32, 64), batches=(1, 3), contexts=(32, 96), decode_tokens=8, repeats=2,
                       cached_tails=(24,))
    with _bursty_vllm() as url:
        cal = profile(url, plan, model="fake-model", seed=3)
    decode = [m for m in cal.measurements if m.kind == "decode"]
    assert [m.steps[0].decode_seqs for m in decode] == [1, 3, 1, 3]
    # The client saw each answer arrive at once; the steps are what the engine stamped.
    assert [m.time_s for m in decode] == pytest.approx([ENGINE_ITL_S] * 4)
    assert cal.fit["decode_timing"] == {"engine": 8, "client": 0}
    # An agent turn's shape: a 24-token chunk alone after each cached context.
    after = sorted((m.steps[0].prefill_tokens, m.steps[0].prefill_context_tokens - m.steps[0].prefill_tokens)
                   for m in cal.measurements if m.kind == "prefill" and m.steps[0].prefill_tokens >= 24
                   and m.steps[0].prefill_context_tokens > m.steps[0].prefill_tokens)
    assert [n for n, _ in after] == [24, 24] and all(cached > 0 for _, cached in after)
