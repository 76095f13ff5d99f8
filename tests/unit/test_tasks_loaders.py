"""Loaders read each real task format into a TaskSpec, refuse bad input, and never execute."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sandgym.tasks import TaskLoadError, load_dataset, load_task_dir
from sandgym.tasks.loaders import detect_format

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tasks"


def copy_fixture(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    return dst


def test_harbor_legacy_keys() -> None:
    t = load_task_dir(FIXTURES / "harbor-legacy")
    assert t.id == "harbor-legacy"
    assert t.source_format == "harbor"
    assert t.instruction.startswith("The file `/app/data/input.txt`")
    assert t.timeouts.agent_timeout_s == 240.0
    assert t.timeouts.verifier_timeout_s == 90.0
    assert t.timeouts.build_timeout_s == 450.0
    assert t.environment.cpus == 2.0
    assert t.environment.memory_mb == 2048  # "2G"
    assert t.environment.storage_mb == 10240  # "10G"
    assert t.environment.build_context == FIXTURES.absolute() / "harbor-legacy" / "environment"
    assert t.verifier.kind == "harbor"
    assert t.verifier.env == {"EXPECTED_LINES": "3"}
    assert t.solution is not None and t.solution.env == {"SOLVER": "oracle"}
    assert t.metadata["category"] == "file-operations"
    assert t.metadata["schema_version"] == "1.0"
    assert t.generator is None and not t.procedural


def test_harbor_current_keys_and_prebuilt_image() -> None:
    t = load_task_dir(FIXTURES / "harbor-image")
    assert t.environment.image == "sandgym/terminal:latest"
    assert t.environment.build_context is None
    assert t.environment.memory_mb == 1536
    assert t.environment.storage_mb == 4096
    assert t.timeouts.verifier_timeout_s == 30.0


def test_tbench_legacy_descriptions_compose_and_keystrokes() -> None:
    t = load_task_dir(FIXTURES / "tbench-legacy")
    assert t.source_format == "tbench"
    assert "hello, terminal" in t.instruction and "without using echo" not in t.instruction
    assert t.timeouts.agent_timeout_s == 180.0
    assert t.timeouts.verifier_timeout_s == 45.0
    assert t.verifier.kind == "tbench" and t.verifier.script == "run-tests.sh"
    # harness-substituted ${T_BENCH_...} values are dropped, literal ones kept
    assert t.environment.env == {"APP_MODE": "bench"}
    assert t.solution is not None and t.solution.keystrokes is not None
    assert [k.block for k in t.solution.keystrokes] == [True, True]
    assert t.solution.keystrokes[1].keys.startswith("printf")
    assert t.metadata["run_tests_in_same_shell"] is False


def test_tbench_instruction_and_solution_sh() -> None:
    t = load_task_dir(FIXTURES / "tbench-modern")
    assert t.instruction == "Write the number of lines of /app/words.txt to /app/count.txt."
    assert t.solution is not None and t.solution.script is not None
    assert t.solution.script.name == "solution.sh"
    assert t.environment.build_context == (FIXTURES / "tbench-modern").resolve()


def test_seta_weights() -> None:
    t = load_task_dir(FIXTURES / "seta-task")
    assert t.source_format == "seta" and t.verifier.kind == "seta"
    assert t.verifier.weights == {
        "test_config_exists": 0.2,
        "test_config_values": 0.5,
        "test_readme_mentions_port": 0.3,
    }


def test_lis_jsonl() -> None:
    tasks = load_dataset(FIXTURES / "lis" / "instances.jsonl")
    by_id = {t.id: t for t in tasks}
    assert set(by_id) == {"lis-math-1", "lis-chem-2", "lis-doc-3"}
    math = by_id["lis-math-1"]
    assert math.verifier.answer is not None and math.verifier.answer.match == "numeric"
    assert math.input_files == {"/testbed/documents/numbers.txt": "10\n20\n12.5\n"}
    assert "/testbed/answer.txt" in math.instruction
    assert by_id["lis-chem-2"].verifier.answer.match == "exact"  # type: ignore[union-attr]
    assert by_id["lis-doc-3"].instruction.startswith("Which city")  # 'prompt' key accepted
    assert math.environment.workdir == "/testbed"


def test_lis_instance_dir(tmp_path: Path) -> None:
    d = tmp_path / "q1"
    d.mkdir()
    (d / "instance.json").write_text(
        json.dumps({"prompt": "2+2?", "ground_truth": "4", "domain": "math"})
    )
    t = load_task_dir(d)
    assert t.id == "q1" and t.verifier.answer.match == "numeric"  # type: ignore[union-attr]


def test_dataset_folder_loads_every_format() -> None:
    ids = {t.id for t in load_dataset(FIXTURES)}
    assert ids == {"harbor-legacy", "harbor-image", "tbench-legacy", "tbench-modern", "seta-task"}
    assert detect_format(FIXTURES / "seta-task") == "seta"


def test_escaping_symlink_is_refused(tmp_path: Path) -> None:
    d = copy_fixture("harbor-image", tmp_path)
    (d / "tests" / "passwd").symlink_to("/etc/passwd")
    with pytest.raises(TaskLoadError, match="outside the task directory"):
        load_task_dir(d)


def test_inner_symlink_is_allowed(tmp_path: Path) -> None:
    d = copy_fixture("harbor-image", tmp_path)
    (d / "tests" / "alias.sh").symlink_to("test.sh")
    assert load_task_dir(d).id == "harbor-image"


def test_loading_never_executes(tmp_path: Path) -> None:
    d = copy_fixture("tbench-modern", tmp_path)
    marker = tmp_path / "executed"
    # YAML tags that would construct Python objects under an unsafe loader
    (d / "task.yaml").write_text(
        f"instruction: !!python/object/apply:os.system ['touch {marker}']\n"
    )
    with pytest.raises(TaskLoadError):
        load_task_dir(d)
    assert not marker.exists()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: (d / "instruction.md").unlink(), "instruction.md"),
        (lambda d: (d / "tests" / "test.sh").unlink(), "tests/test.sh"),
        (lambda d: (d / "task.toml").write_text("version = [\n"), "invalid TOML"),
        (lambda d: (d / "task.toml").write_text('version = "2.0"\n'), "schema version 1.x"),
        (lambda d: (d / "task.toml").write_text('[environment]\nmemory = "lots"\n'), "2G"),
    ],
)
def test_harbor_errors_say_what_was_expected(tmp_path: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    d = copy_fixture("harbor-legacy", tmp_path)
    mutate(d)
    with pytest.raises(TaskLoadError, match=message):
        load_task_dir(d)


def test_not_a_task_dir(tmp_path: Path) -> None:
    with pytest.raises(TaskLoadError, match="not a task directory"):
        load_task_dir(tmp_path)


def test_tbench_without_instruction(tmp_path: Path) -> None:
    d = copy_fixture("tbench-legacy", tmp_path)
    (d / "task.yaml").write_text("descriptions:\n  - key: hard\n    description: x\n")
    with pytest.raises(TaskLoadError, match="key 'base'"):
        load_task_dir(d)


def test_seta_bad_weights(tmp_path: Path) -> None:
    d = copy_fixture("seta-task", tmp_path)
    (d / "weights.json").write_text('{"a": -1}')
    with pytest.raises(TaskLoadError, match="weights"):
        load_task_dir(d)


def test_lis_bad_lines(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_text('{"prompt": "q"}\n')
    with pytest.raises(TaskLoadError, match="ground_truth"):
        load_dataset(p)
    p.write_text('{"prompt": "q", "ground_truth": "a", "input_files": {"../../etc/x": "y"}}\n')
    with pytest.raises(TaskLoadError, match="relative"):
        load_dataset(p)
