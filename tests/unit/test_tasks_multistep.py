"""Loading Harbor multi-step tasks: `[[steps]]` and `steps/<name>/`, the gate's forms, the
aggregation, per-step tests/solutions/timeouts/networks, and the named errors of bad ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgym.sandboxes.network import NO_NETWORK, PUBLIC, NetworkPolicy
from sandgym.tasks.episode_models import EpisodeSetup
from sandgym.tasks.errors import TaskLoadError
from sandgym.tasks.loaders import load_task_dir
from sandgym.tasks.sandbox_spec import sandbox_spec_for
from sandgym.tasks.steps import step_view


def _task(tmp_path: Path, toml: str, steps: dict[str, dict[str, str]], shared_test: bool = False):
    d = tmp_path / "t"
    (d / "environment").mkdir(parents=True)
    (d / "environment" / "Dockerfile").write_text("FROM sandgym/terminal:latest\n")
    (d / "task.toml").write_text('version = "1.0"\n' + toml)
    (d / "tests").mkdir()
    (d / "tests" / "lib.sh").write_text("shared\n")
    if shared_test:
        (d / "tests" / "test.sh").write_text("echo shared\n")
    for name, files in steps.items():
        for rel, text in files.items():
            p = d / "steps" / name / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
    return d


ONE = {"instruction.md": "do one\n", "tests/test.sh": "echo one\n", "solution/solve.sh": "x\n"}
TWO = {"instruction.md": "do two\n", "workdir/setup.sh": "touch m\n"}


def test_steps_load_in_order_with_their_parts(tmp_path: Path) -> None:
    toml = """
multi_step_reward_strategy = "final"
[agent]
network_mode = "no-network"
[[steps]]
name = "one"
min_reward = 0.5
[steps.verifier]
timeout_sec = 7
[[steps]]
name = "two"
min_reward = { reward = 1.0, style = 0.5 }
[steps.agent]
timeout_sec = 9
network_mode = "public"
"""
    task = load_task_dir(_task(tmp_path, toml, {"one": ONE, "two": TWO}, shared_test=True))
    assert [s.name for s in task.steps] == ["one", "two"]
    assert task.instruction == "do one\n"
    assert task.multi_step_reward == "final"
    one, two = task.steps
    assert one.min_reward == {"reward": 0.5}
    assert two.min_reward == {"reward": 1.0, "style": 0.5}
    assert one.verifier.script_path.parent.name == "tests"  # the step's own test.sh
    assert one.verifier.script_path.parent.parent.name == "one"
    assert two.verifier.script_path == task.source_dir / "tests" / "test.sh"  # the shared one
    assert one.solution is not None and one.solution.script.parent.parent.name == "one"
    assert two.has_setup and two.workdir_dir is not None
    assert (one.verifier_timeout_s, two.agent_timeout_s) == (7.0, 9.0)
    assert task.network_plan(one).agent == NO_NETWORK
    assert task.network_plan(two).agent == PUBLIC
    spec = sandbox_spec_for(task)
    assert spec.network == PUBLIC and spec.network_later == (NO_NETWORK,)


def test_step_view_overlays_the_steps_tests_on_the_shared_ones(tmp_path: Path) -> None:
    task = load_task_dir(_task(tmp_path, '[[steps]]\nname = "one"\n', {"one": ONE}))
    view = step_view(task, EpisodeSetup(instruction="", seed=0))
    merged = view.verifier.tests_dir
    assert merged is not None
    assert sorted(p.name for p in merged.iterdir()) == ["lib.sh", "test.sh"]
    assert (merged / "test.sh").read_text() == "echo one\n"
    assert view.instruction == "do one\n"


@pytest.mark.parametrize(
    ("toml", "steps", "match"),
    [
        ('[[steps]]\nname = "one"\n[[steps]]\nname = "one"\n', {"one": ONE}, "unique"),
        ('[[steps]]\nname = "../x"\n', {"one": ONE}, "directory name"),
        ('[[steps]]\nname = "missing"\n', {"one": ONE}, "steps/missing/"),
        ('[[steps]]\nname = "two"\n', {"two": TWO}, "test.sh"),
        (
            'multi_step_reward_strategy = "max"\n[[steps]]\nname = "one"\n',
            {"one": ONE},
            "'mean' or 'final'",
        ),
        ("steps = []\n", {"one": ONE}, "non-empty"),
        ('[[steps]]\nname = "one"\nmin_reward = "high"\n', {"one": ONE}, "min_reward"),
    ],
)
def test_bad_multi_step_tasks_are_named_errors(
    tmp_path: Path, toml: str, steps: dict[str, dict[str, str]], match: str
) -> None:
    with pytest.raises(TaskLoadError, match=match):
        load_task_dir(_task(tmp_path, toml, steps))


def test_a_steps_folder_without_steps_in_the_toml_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TaskLoadError, match=r"\[\[steps\]\]"):
        load_task_dir(_task(tmp_path, "", {"one": ONE}))


def test_allowlisted_step_verifier(tmp_path: Path) -> None:
    toml = '[[steps]]\nname = "one"\n[steps.verifier]\nallowed_hosts = ["pypi.org"]\n'
    task = load_task_dir(_task(tmp_path, toml, {"one": ONE}))
    allow = NetworkPolicy(mode="allowlist", allowed_hosts=["pypi.org"])
    assert task.network_plan(task.steps[0]).verifier == allow
    assert sandbox_spec_for(task).network_later == (allow,)


# -- separate verifier environments (Harbor's environment_mode) ------------------------------


def _single(tmp_path: Path, toml: str, tests_dockerfile: bool = False) -> Path:
    d = tmp_path / "s"
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "environment" / "Dockerfile").write_text("FROM sandgym/terminal:latest\n")
    (d / "tests" / "test.sh").write_text("echo\n")
    if tests_dockerfile:
        (d / "tests" / "Dockerfile").write_text("FROM sandgym/base:bookworm\n")
    (d / "instruction.md").write_text("x\n")
    (d / "task.toml").write_text('version = "1.0"\n' + toml)
    return d


def test_shared_by_default(tmp_path: Path) -> None:
    assert load_task_dir(_single(tmp_path, "")).verifier_environment is None


def test_separate_builds_from_the_tests_dockerfile(tmp_path: Path) -> None:
    toml = '[verifier]\nenvironment_mode = "separate"\n'
    task = load_task_dir(_single(tmp_path, toml, tests_dockerfile=True))
    env = task.verifier_environment
    assert env is not None and env.build_context == task.source_dir / "tests"
    from sandgym.tasks.verifier.separate import verifier_sandbox_spec

    spec = verifier_sandbox_spec(task, workdir="/work")
    assert spec.build_context == task.source_dir / "tests" and spec.workdir == "/work"


def test_separate_without_a_dockerfile_reuses_the_task_environment(tmp_path: Path) -> None:
    task = load_task_dir(_single(tmp_path, '[verifier]\nenvironment_mode = "separate"\n'))
    assert task.verifier_environment == task.environment


def test_a_verifier_environment_table_implies_separate(tmp_path: Path) -> None:
    toml = (
        '[verifier.environment]\ndocker_image = "grader:1"\nmemory_mb = 512\n'
        'network_mode = "no-network"\n'
    )
    env = load_task_dir(_single(tmp_path, toml)).verifier_environment
    assert env is not None and env.image == "grader:1" and env.build_context is None
    assert env.memory_mb == 512 and env.network == NO_NETWORK


def test_artifacts_are_read(tmp_path: Path) -> None:
    toml = 'artifacts = ["/srv/out", { source = "/var/log/app.log" }]\n'
    assert load_task_dir(_single(tmp_path, toml)).artifacts == ("/srv/out", "/var/log/app.log")


@pytest.mark.parametrize(
    ("toml", "match"),
    [
        ('[verifier]\nenvironment_mode = "elsewhere"\n', "'shared' or 'separate'"),
        (
            '[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ncpus = 1\n',
            "conflicts",
        ),
        ('artifacts = ["relative/path"]\n', "absolute"),
    ],
)
def test_bad_verifier_environments(tmp_path: Path, toml: str, match: str) -> None:
    with pytest.raises(TaskLoadError, match=match):
        load_task_dir(_single(tmp_path, toml))


def test_a_step_can_go_back_to_a_shared_verifier(tmp_path: Path) -> None:
    toml = (
        '[verifier]\nenvironment_mode = "separate"\n[[steps]]\nname = "one"\n'
        '[steps.verifier]\nenvironment_mode = "shared"\n'
    )
    task = load_task_dir(_task(tmp_path, toml, {"one": ONE}))
    assert task.verifier_environment is not None
    view = step_view(task, EpisodeSetup(instruction="", seed=0))
    assert view.verifier_environment is None


def test_a_generator_timeout_from_metadata(tmp_path: Path) -> None:
    d = _single(
        tmp_path, '[metadata]\ngenerator = "environment/gen.py"\ngenerator_timeout_sec = 90\n'
    )
    (d / "environment" / "gen.py").write_text("print(1)\n")
    task = load_task_dir(d)
    assert task.generator is not None and task.generator.timeout_s == 90.0
