"""Loader for LLM-in-Sandbox instances (JSONL, one problem per line).

Each line: `id`, `problem_statement` (or `prompt`), `ground_truth`, `domain`, and
`input_files` (name -> text, or that object as a JSON string). The input files go to
`/testbed/documents/`; the agent writes its final answer to `/testbed/answer.txt`, which is
compared with the ground truth: numerically for numeric domains (math, physics, chemistry)
when the ground truth is a number, else exactly after normalisation. An instance may set
`match` ("exact" or "numeric") to override the domain rule.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sandgym.tasks.errors import TaskLoadError
from sandgym.tasks.loaders.common import read_text
from sandgym.tasks.models import AnswerSpec, EnvironmentSpec, TaskSpec, VerifierSpec
from sandgym.tasks.verifier.rewards import parse_number

NUMERIC_DOMAINS = {"math", "physics", "chemistry", "chem", "finance"}
WORKDIR = "/testbed"
INPUT_DIR = "/testbed/documents"
ANSWER_PATH = "/testbed/answer.txt"

_ID_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def looks_like_number(text: str) -> bool:
    return parse_number(text) is not None


def instance_to_task(obj: dict[str, Any], where: str, default_id: str) -> TaskSpec:
    prompt = obj.get("problem_statement", obj.get("prompt"))
    if not isinstance(prompt, str) or not prompt.strip():
        raise TaskLoadError(f"{where}: expected a non-empty 'problem_statement' or 'prompt'")
    if "ground_truth" not in obj or obj["ground_truth"] is None:
        raise TaskLoadError(f"{where}: expected 'ground_truth', found none")
    truth = str(obj["ground_truth"]).strip()
    domain = str(obj.get("domain", "general"))
    task_id = str(obj.get("id", default_id))
    if not _ID_OK.match(task_id):
        raise TaskLoadError(f"{where}: id {task_id!r} must be letters, digits, '.', '_' or '-'")

    files = obj.get("input_files") or {}
    if isinstance(files, str):
        try:
            files = json.loads(files) if files.strip() else {}
        except json.JSONDecodeError as exc:
            raise TaskLoadError(f"{where}: input_files is not valid JSON: {exc}") from None
    if not isinstance(files, dict):
        raise TaskLoadError(f"{where}: input_files must map names to text, found {files!r}")
    input_files: dict[str, str] = {}
    for name, content in files.items():
        if content is None:
            continue
        name = str(name)
        if name.startswith("/") or ".." in Path(name).parts or not name:
            raise TaskLoadError(f"{where}: input file name {name!r} must be relative, no '..'")
        input_files[f"{INPUT_DIR}/{name}"] = str(content)

    match = obj.get("match")
    if match is None:
        match = (
            "numeric" if domain.lower() in NUMERIC_DOMAINS and looks_like_number(truth) else "exact"
        )
    if match not in ("exact", "numeric"):
        raise TaskLoadError(f"{where}: match must be 'exact' or 'numeric', found {match!r}")

    files_note = f"The input files are in {INPUT_DIR}/.\n" if input_files else ""
    instruction = (
        f"{prompt.strip()}\n\n{files_note}Write only your final answer to {ANSWER_PATH}.\n"
    )
    return TaskSpec(
        id=task_id,
        instruction=instruction,
        environment=EnvironmentSpec(workdir=WORKDIR),
        verifier=VerifierSpec(
            kind="answer",
            answer=AnswerSpec(ground_truth=truth, match=match, answer_path=ANSWER_PATH),
        ),
        input_files=input_files,
        source_format="lis",
        metadata={"domain": domain},
    )


def load_lis_jsonl(path: Path) -> list[TaskSpec]:
    tasks: list[TaskSpec] = []
    seen: set[str] = set()
    for no, line in enumerate(read_text(path, "a JSONL file").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{no}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskLoadError(f"{where}: invalid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise TaskLoadError(f"{where}: expected an object, found {type(obj).__name__}")
        task = instance_to_task(obj, where, default_id=f"{path.stem}-{no}")
        if task.id in seen:
            raise TaskLoadError(f"{where}: duplicate id {task.id!r}")
        seen.add(task.id)
        tasks.append(task.model_copy(update={"source_dir": path.parent}))
    if not tasks:
        raise TaskLoadError(f"{path}: no instances found")
    return tasks


def load_lis_dir(path: Path) -> TaskSpec:
    """A directory holding one instance as `instance.json`."""
    p = path / "instance.json"
    try:
        obj = json.loads(read_text(p, "instance.json"))
    except json.JSONDecodeError as exc:
        raise TaskLoadError(f"{p}: invalid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise TaskLoadError(f"{p}: expected an object")
    obj.setdefault("id", path.name)
    return instance_to_task(obj, str(p), path.name).model_copy(update={"source_dir": path})
