"""Weights as files: the learner's tensors written as a Hugging Face safetensors directory, the
form a server in another process (`vllm serve`, vLLM's engine core) reads them back from.

`write_weights(items, out_dir)` writes `model-0000K-of-0000N.safetensors` shards of at most
`max_shard_bytes` each (a larger tensor gets a file of its own) plus
`model.safetensors.index.json` (the layout `save_pretrained` writes for large models, which vLLM's
loader and transformers read); a full shard is written before the next tensor is asked for, so
the writer holds at most max(`max_shard_bytes`, the largest tensor) at a time. `read_weights(dir)` yields the tensors of such
a directory, or of a single `model.safetensors`, one at a time. torch and safetensors only.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
#: shard size of pushed weights (the most the writer buffers before writing a file)
DEFAULT_SHARD_BYTES = 256 * 1024 * 1024


def _nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size())


def write_weights(
    items: Iterable[tuple[str, Any]],
    out_dir: str | Path,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> dict[str, int]:
    """Write `(name, tensor)` pairs as safetensors shards + index into `out_dir` (replaced
    atomically: written beside it, then renamed). Returns {"tensors", "bytes", "shards",
    "peak_buffered_bytes"}: the last is the most tensor bytes held at once while writing."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    tmp = out.with_name(out.name + ".writing")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    weight_map: dict[str, str] = {}
    buffer: dict[str, Any] = {}
    buffered = peak = total = 0
    files: list[list[str]] = []

    def flush() -> None:
        nonlocal buffer, buffered
        if not buffer:
            return
        name = f"part-{len(files):05d}.safetensors"
        save_file(buffer, str(tmp / name), metadata={"format": "pt"})
        files.append(list(buffer))
        buffer, buffered = {}, 0

    for name, tensor in items:
        t = tensor.detach().to("cpu").contiguous()
        if buffered and buffered + _nbytes(t) > max_shard_bytes:
            flush()
        buffer[name] = t
        buffered += _nbytes(t)
        total += _nbytes(t)
        peak = max(peak, buffered)
        del t, tensor
        if buffered >= max_shard_bytes:  # written before the next tensor is asked for
            flush()
    flush()
    n = len(files)
    for k, names in enumerate(files):
        final = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        os.replace(tmp / f"part-{k:05d}.safetensors", tmp / final)
        weight_map.update(dict.fromkeys(names, final))
    (tmp / INDEX_NAME).write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return {"tensors": len(weight_map), "bytes": total, "shards": n, "peak_buffered_bytes": peak}


def weight_files(path: str | Path) -> list[Path]:
    """The safetensors files of a weights directory: those its index names, else
    `model.safetensors`; a named error when there are none."""
    p = Path(path)
    index = p / INDEX_NAME
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [p / n for n in names]
    if (p / SINGLE_NAME).is_file():
        return [p / SINGLE_NAME]
    raise FileNotFoundError(
        f"{p} holds no weights: expected {INDEX_NAME} (sharded) or {SINGLE_NAME}"
    )


def read_weights(path: str | Path) -> Iterator[tuple[str, Any]]:
    """Every tensor of a weights directory (sharded or single-file), one at a time."""
    from safetensors import safe_open

    for f in weight_files(path):
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield key, fh.get_tensor(key)


def load_weights(path: str | Path) -> dict[str, Any]:
    """All tensors of a weights directory in one dict."""
    return dict(read_weights(path))
