"""guidellm (a third-party load generator) against ``tokenomy emulate``, offline.

Builds a small byte-level BPE ``tokenizer.json`` (the ``tokenizers`` package, no download) that
both sides use: the emulator via ``--tokenizer`` and guidellm via ``--tokenizer kind=hf_auto``
pointing at the local folder. Starts the emulator on a free loopback port, runs guidellm's
``concurrent`` profile, prints its TTFT/ITL/throughput next to the perf model's step time, and
writes them with ``--json OUT``. Needs ``pip install guidellm`` (not a project dependency).

    python benchmarks/guidellm_smoke.py --streams 4 --requests 20 --json out/guidellm.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tokenomy.core import StepShape
from tokenomy.emulator.tokenizer import WORDS
from tokenomy.perf import PerfModel


def make_tokenizer(folder: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, show_progress=False, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(WORDS)] * 50, trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "model_max_length": 32768}))
    return folder / "tokenizer.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    guidellm = shutil.which("guidellm") or str(Path(sys.executable).parent / "guidellm")
    if not Path(guidellm).exists():
        print("guidellm_smoke: guidellm is not installed (pip install guidellm)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        tokenizer = make_tokenizer(tmp)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([sys.executable, "-m", "tokenomy.emulator", "--port", str(port), "--tokenizer",
                                   str(tokenizer), "--served-model-name", "tiny"], stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    print("guidellm_smoke: the emulator did not start", file=sys.stderr)
                    return 1
                time.sleep(0.2)
            out = tmp / "guidellm.json"
            cmd = [guidellm, "run", "--backend", f"kind=openai_http,target={url},model=tiny",
                   "--profile", f"kind=concurrent,streams={args.streams}",
                   "--constraint", f"kind=max_requests,count={args.requests}",
                   "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},"
                             f"output_tokens={args.output_tokens}",
                   "--tokenizer", f"kind=hf_auto,model={tmp}",
                   "--output", f"kind=json,path={out}", "--disable-progress"]
            print("$ " + " ".join(cmd), flush=True)
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
            rc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL).returncode
            if rc != 0 or not out.exists():
                print(f"guidellm_smoke: guidellm exited with status {rc}", file=sys.stderr)
                return 1
            report = json.loads(out.read_text())
        finally:
            server.terminate()
            server.wait(10)
    m = report["benchmarks"][0]["metrics"]

    def stat(name: str, key: str = "median") -> float:
        return float(m[name]["successful"][key])

    perf = PerfModel.from_names("llama-3.1-8b", "h100")
    ctx = args.streams * (args.prompt_tokens + args.output_tokens // 2)
    model_itl_ms = perf.step_time_s(StepShape(decode_seqs=args.streams, decode_context_tokens=ctx)) * 1e3
    result = {
        "completed_requests": int(m["request_totals"]["successful"]),
        "errored_requests": int(m["request_totals"]["errored"]),
        "ttft_ms_p50": stat("time_to_first_token_ms"),
        "itl_ms_p50": stat("inter_token_latency_ms"),
        "itl_ms_model": model_itl_ms,
        "output_tokens_per_s": stat("output_tokens_per_second", "mean"),
        "prompt_tokens_p50": stat("prompt_token_count"),
        "output_tokens_p50": stat("output_token_count"),
    }
    for k, v in result.items():
        print(f"{k:22s} {v:10.2f}" if isinstance(v, float) else f"{k:22s} {v:10d}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if result["completed_requests"] == args.requests and result["errored_requests"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
