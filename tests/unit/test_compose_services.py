"""Multi-container tasks and healthchecks, without Docker: compose files (Harbor's `main`,
Terminal-Bench 1's `client`) load into the main service's settings plus `ServiceSpec`s, keys
sandgym does not run are refused by name, the fingerprint covers every service, backends that
cannot run a group refuse it, and the healthcheck runner follows Harbor's semantics."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sandgym.sandboxes import SandboxSpec
from sandgym.sandboxes.base import SandboxBackend
from sandgym.sandboxes.errors import SandboxGroupUnsupportedError, SandboxHealthcheckError
from sandgym.sandboxes.health import run_healthcheck
from sandgym.sandboxes.null import NullBackend
from sandgym.sandboxes.services import HealthcheckSpec, ServiceSpec, start_order
from sandgym.sandboxes.spec import ExecResult
from sandgym.tasks import TaskLoadError, load_task_dir
from sandgym.tasks.errors import ComposeUnsupportedError
from sandgym.tasks.sandbox_spec import sandbox_spec_for


def harbor_task(root: Path, compose: str | None, toml_extra: str = "") -> Path:
    d = root / "task"
    (d / "environment" / "web").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "environment" / "Dockerfile").write_text("FROM sandgym/terminal:latest\n")
    (d / "environment" / "web" / "Dockerfile.web").write_text("FROM sandgym/terminal:latest\n")
    (d / "environment" / "web" / "app.py").write_text("print('hi')\n")
    if compose is not None:
        (d / "environment" / "docker-compose.yaml").write_text(textwrap.dedent(compose))
    (d / "task.toml").write_text('version = "1.0"\n[environment]\n' + textwrap.dedent(toml_extra))
    (d / "instruction.md").write_text("do it\n")
    (d / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return d


HARBOR_COMPOSE = """\
    services:
      main:
        environment:
          - DB_HOST=db
          - FROM_MAIN=${CONTEXT_DIR}
        working_dir: /srv
        depends_on:
          db:
            condition: service_healthy
        command: ["sleep", "infinity"]
      db:
        image: postgres:15
        restart: always
        environment:
          POSTGRES_PASSWORD: secret
          PORT: ${DB_PORT:-5432}
          LITERAL: "$$HOME"
        command: postgres -c 'max_connections=20'
        healthcheck:
          test: ["CMD-SHELL", "pg_isready -U postgres"]
          interval: 1m30s
          timeout: 500ms
          start_period: 2s
          retries: 7
        ports: ["5432:5432"]
      web:
        build:
          context: ./web
          dockerfile: Dockerfile.web
        entrypoint: ["python3", "app.py"]
        user: "1000"
        depends_on: [db]
        networks:
          default:
            aliases: [www]
        links: ["db:database"]
        healthcheck:
          test: ["CMD", "curl", "-f", "http://localhost"]
      init:
        image: sandgym/terminal:latest
        healthcheck:
          disable: true
    networks:
      default: {}
"""


def test_harbor_compose_main_and_services(tmp_path: Path) -> None:
    d = harbor_task(tmp_path, HARBOR_COMPOSE, 'env = { TOML = "1", DB_HOST = "toml-wins" }\n')
    env = load_task_dir(d).environment
    assert env.service_name == "main"
    assert env.env == {
        "DB_HOST": "toml-wins",
        "FROM_MAIN": str(d / "environment"),
        "TOML": "1",
    }
    assert env.workdir == "/srv"
    assert env.build_context == d / "environment"  # main keeps Harbor's own build
    svc = {s.name: s for s in env.services}
    assert list(svc) == ["db", "web", "init"]
    db = svc["db"]
    assert db.image == "postgres:15" and db.build_context is None
    assert db.env == {"POSTGRES_PASSWORD": "secret", "PORT": "5432", "LITERAL": "$HOME"}
    assert db.command == ("postgres", "-c", "max_connections=20")
    assert db.healthcheck == HealthcheckSpec(
        command="pg_isready -U postgres",
        interval_s=90.0,
        timeout_s=0.5,
        start_period_s=2.0,
        start_interval_s=5.0,
        retries=7,
    )
    assert db.aliases == ("database",)  # from web's link
    web = svc["web"]
    assert web.build_context == (d / "environment" / "web").resolve()
    assert web.dockerfile == "Dockerfile.web"
    assert web.entrypoint == ("python3", "app.py") and web.command is None
    assert web.user == "1000"
    assert web.depends_on == {"db": "service_started"}
    assert web.aliases == ("www",)
    assert web.healthcheck is not None and web.healthcheck.command == (
        "curl",
        "-f",
        "http://localhost",
    )
    assert web.healthcheck.docker_config()["test"] == ["CMD", "curl", "-f", "http://localhost"]
    assert svc["init"].healthcheck_disabled
    assert [s.name for s in start_order(env.services)] == ["db", "web", "init"]
    spec = sandbox_spec_for(load_task_dir(d))
    assert spec.services == env.services and spec.service_name == "main"


def test_harbor_environment_healthcheck(tmp_path: Path) -> None:
    d = harbor_task(
        tmp_path,
        None,
        """\
        [environment.healthcheck]
        command = "test -f /tmp/ready"
        interval_sec = 0.5
        retries = 9
        """,
    )
    task = load_task_dir(d)
    hc = task.environment.healthcheck
    # Harbor's defaults for what the table leaves out
    assert hc == HealthcheckSpec(
        command="test -f /tmp/ready",
        interval_s=0.5,
        timeout_s=30.0,
        start_period_s=0.0,
        start_interval_s=5.0,
        retries=9,
    )
    assert task.environment.services == ()
    assert sandbox_spec_for(task).healthcheck == hc


def test_harbor_healthcheck_table_errors(tmp_path: Path) -> None:
    d = harbor_task(tmp_path, None, "[environment.healthcheck]\ncmd = 'true'\n")
    with pytest.raises(TaskLoadError, match=r"unknown keys \['cmd'\]"):
        load_task_dir(d)


def test_a_harbor_docker_compose_yml_is_task_data_not_the_environment(tmp_path: Path) -> None:
    """Harbor reads `environment/docker-compose.yaml` only; a TermiGen task ships a JSON file
    named `docker-compose.yml` that its Dockerfile copies in as the puzzle's data."""
    d = harbor_task(tmp_path, None)
    (d / "environment" / "docker-compose.yml").write_text('{"api_gateway": {"retries": 3}}\n')
    env = load_task_dir(d).environment
    assert env.services == () and env.build_context == d / "environment"
    # the same file under Harbor's name is the environment, and refused by name
    (d / "environment" / "docker-compose.yml").rename(d / "environment" / "docker-compose.yaml")
    with pytest.raises(ComposeUnsupportedError, match="api_gateway"):
        load_task_dir(d)


def test_main_compose_healthcheck_is_the_sandbox_one(tmp_path: Path) -> None:
    compose = """\
        services:
          main:
            healthcheck:
              test: curl -f http://localhost:80
              interval: 2s
    """
    d = harbor_task(tmp_path, compose)
    env = load_task_dir(d).environment
    assert env.services == ()
    assert env.healthcheck is not None
    assert env.healthcheck.command == "curl -f http://localhost:80"
    assert env.healthcheck.interval_s == 2.0


TB1_COMPOSE = """\
    services:
      client:
        build:
          dockerfile: Dockerfile
        image: ${T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME}
        container_name: ${T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME}
        command: [ "sh", "-c", "sleep infinity" ]
        environment:
          - TEST_DIR=${T_BENCH_TEST_DIR}
          - MODE=strict
        volumes:
          - ${T_BENCH_TASK_LOGS_PATH}:${T_BENCH_CONTAINER_LOGS_PATH}
        depends_on: [server]
      server:
        build:
          context: ./server
        image: ${T_BENCH_TASK_DOCKER_NAME_PREFIX}__server
        environment:
          - LOG_DIR=${T_BENCH_CONTAINER_LOGS_PATH}
          - PORT=8080
        expose: ["8080"]
"""


def tb1_task(root: Path, compose: str) -> Path:
    d = root / "tb1"
    (d / "server").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "Dockerfile").write_text("FROM sandgym/terminal:latest\n")
    (d / "server" / "Dockerfile").write_text("FROM sandgym/terminal:latest\n")
    (d / "task.yaml").write_text("instruction: do it\n")
    (d / "run-tests.sh").write_text("#!/bin/bash\n")
    (d / "docker-compose.yaml").write_text(textwrap.dedent(compose))
    return d


def test_tbench_client_and_services(tmp_path: Path) -> None:
    d = tb1_task(tmp_path, TB1_COMPOSE)
    task = load_task_dir(d)
    env = task.environment
    assert env.service_name == "client"
    assert env.build_context == d.resolve() and env.image is None
    assert env.env == {"MODE": "strict"}  # the harness's TEST_DIR is the verifier's to set
    (server,) = env.services
    assert server.name == "server"
    assert server.build_context == (d / "server").resolve()
    assert server.image is None  # the harness's name for the image it builds
    assert server.env == {"PORT": "8080"}
    assert sandbox_spec_for(task).service_name == "client"


def test_a_bind_mount_of_the_tasks_own_folder_is_copied_into_the_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Terminal-Bench 1's word2vec-from-scratch mounts `./cached_models:/app/cached_models`:
    the task loads, and its built image holds the folder at the target (what the mount shows
    the container at start); a mount beside the main service, or of a path outside the task,
    is still refused by name."""
    compose = TB1_COMPOSE.replace(
        "          - ${T_BENCH_TASK_LOGS_PATH}:${T_BENCH_CONTAINER_LOGS_PATH}\n",
        "          - ${T_BENCH_TASK_LOGS_PATH}:${T_BENCH_CONTAINER_LOGS_PATH}\n"
        "          - ./cached_models:/app/cached_models\n"
        "          - ./notes.txt:/srv/notes.txt\n",
    )
    d = tb1_task(tmp_path, compose)
    (d / "cached_models").mkdir()
    (d / "cached_models" / "vocab.txt").write_text("the\nof\n")
    (d / "notes.txt").write_text("n")
    task = load_task_dir(d)
    assert task.environment.bind_mounts == (
        ((d / "cached_models").resolve(), "/app/cached_models"),
        ((d / "notes.txt").resolve(), "/srv/notes.txt"),
    )
    monkeypatch.setenv("SANDGYM_CACHE", str(tmp_path / "cache"))
    spec = sandbox_spec_for(task)
    assert spec.build_context is not None and spec.build_context != d.resolve()
    lines = (spec.build_context / "Dockerfile").read_text().splitlines()
    assert lines[-2:] == [
        "COPY .sandgym-mounts/0/ /app/cached_models",
        "COPY .sandgym-mounts/1/notes.txt /srv/notes.txt",
    ]
    assert (spec.build_context / ".sandgym-mounts/0/vocab.txt").read_text() == "the\nof\n"
    assert (spec.build_context / ".sandgym-mounts/1/notes.txt").read_text() == "n"
    outside = compose.replace("./cached_models:", "../../etc:")
    with pytest.raises(ComposeUnsupportedError, match="copies only a task's own files"):
        load_task_dir(tb1_task(tmp_path / "o", outside))


@pytest.mark.parametrize(
    ("service", "needle"),
    [
        ("privileged: true", "unsupported keys ['privileged']"),
        ("cap_add: [NET_ADMIN]", "unsupported keys ['cap_add']"),
        ("network_mode: host", "unsupported keys ['network_mode']"),
        ("volumes: ['./data:/data']", "copies only a task's own files"),
        ("volumes: ['/etc:/data']", "copies only a task's own files"),
        ("volumes: ['pgdata:/var/lib/postgresql']", "copies only a task's own files"),
        ("build: {context: ./web, dockerfile: Dockerfile.web, args: {A: '1'}}", "['args']"),
        ("build: ../../outside", "lies outside the task directory"),
        ("healthcheck: {test: [BOGUS, x]}", "healthcheck"),
        ("healthcheck: {test: 'true', interval: soon}", "expected a duration"),
    ],
)
def test_unsupported_compose_is_refused_by_name(tmp_path: Path, service: str, needle: str) -> None:
    compose = f"services:\n  main: {{}}\n  db:\n    image: postgres:15\n    {service}\n"
    d = harbor_task(tmp_path, compose)
    with pytest.raises(ComposeUnsupportedError) as err:
        load_task_dir(d)
    assert needle in str(err.value), err.value
    assert "service 'db'" in str(err.value), err.value


@pytest.mark.parametrize(
    ("compose", "needle"),
    [
        ("services:\n  main: {}\nsecrets: {}\n", "unsupported top-level keys ['secrets']"),
        ("services:\n  app: {image: x}\n", "expected a 'main' service"),
        (
            "services:\n  main: {}\n  a: {image: x, depends_on: [b]}\n  b: {image: x, "
            "depends_on: [a]}\n",
            "cycle",
        ),
        ("services:\n  main: {}\n  a: {image: x, depends_on: [nope]}\n", "'nope'"),
        ("services:\n  main: {}\n  a: {image: x, depends_on: [main]}\n", "main service"),
        ("services:\n  main: {}\n  a: {environment: {A: '1'}}\n", "needs an image"),
    ],
)
def test_bad_compose_files(tmp_path: Path, compose: str, needle: str) -> None:
    d = harbor_task(tmp_path, compose)
    with pytest.raises(TaskLoadError) as err:
        load_task_dir(d)
    assert needle in str(err.value), err.value


# -- fingerprint ---------------------------------------------------------------------------------


def test_fingerprint_covers_every_service(tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM sandgym/terminal:latest\n")

    def spec(**svc: object) -> SandboxSpec:
        fields: dict[str, object] = {"name": "db", "image": "postgres:15", **svc}
        return SandboxSpec(services=(ServiceSpec(**fields),))  # type: ignore[arg-type]

    base = spec().fingerprint("docker")
    assert spec().fingerprint("docker") == base
    assert SandboxSpec().fingerprint("docker") != base
    changed = [
        spec(image="postgres:16"),
        spec(env={"A": "1"}),
        spec(command=("postgres",)),
        spec(entrypoint=("sh",)),
        spec(aliases=("database",)),
        spec(healthcheck=HealthcheckSpec(command="true")),
        spec(name="db2"),
        SandboxSpec(services=spec().services, service_name="client"),
        SandboxSpec(healthcheck=HealthcheckSpec(command="true")),
    ]
    prints = {s.fingerprint("docker") for s in changed}
    assert base not in prints and len(prints) == len(changed)
    # a build context is covered by its content, not its path
    built = SandboxSpec(services=(ServiceSpec(name="web", build_context=ctx),))
    assert built.needs_hashing("docker")
    before = built.fingerprint("docker")
    (ctx / "app.py").write_text("print(1)\n")
    again = SandboxSpec(services=(ServiceSpec(name="web", build_context=ctx),))
    assert again.fingerprint("docker") != before


def test_spec_checks_the_group() -> None:
    db = ServiceSpec(name="db", image="x")
    with pytest.raises(ValueError, match="more than once"):
        SandboxSpec(services=(db, db))
    with pytest.raises(ValueError, match="sandbox's own"):
        SandboxSpec(services=(ServiceSpec(name="main", image="x"),))
    with pytest.raises(ValueError, match="service name"):
        ServiceSpec(name="-bad", image="x")


# -- backends that cannot run a group --------------------------------------------------------------


async def test_backends_without_groups_refuse_services(tmp_path: Path) -> None:
    from sandgym.sandboxes.docker import DockerBackend
    from sandgym.sandboxes.e2b import E2BBackend
    from sandgym.sandboxes.local import LocalBackend
    from sandgym.server.errors import to_wire_error

    spec = SandboxSpec(services=(ServiceSpec(name="db", image="postgres:15"),))
    null = NullBackend()
    with pytest.raises(SandboxGroupUnsupportedError, match="null backend cannot run"):
        await null.create(spec)
    assert null.created == 0
    local = LocalBackend(root=tmp_path / "local")
    with pytest.raises(SandboxGroupUnsupportedError, match="local backend"):
        await local.create(spec)
    assert E2BBackend.check_services is SandboxBackend.check_services  # refuses as the base
    with pytest.raises(SandboxGroupUnsupportedError):
        SandboxBackend.check_services(null, spec)
    DockerBackend.check_services(DockerBackend.__new__(DockerBackend), spec)  # accepted
    wire = to_wire_error(SandboxGroupUnsupportedError("no group here"))
    assert (wire.code, wire.retryable) == ("unknown_task", False)


# -- the healthcheck runner ------------------------------------------------------------------------


class Scripted:
    """A sandbox whose exec answers from a script of (exit code, output, timed out)."""

    id = "sg-scripted"

    def __init__(self, answers: list[tuple[int | None, str, bool]]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, float, str | None]] = []

    async def exec(self, cmd: str, timeout_s: float = 60.0, user: str | None = None) -> ExecResult:
        self.calls.append((cmd, timeout_s, user))
        code, out, timed_out = self.answers.pop(0)
        return ExecResult(exit_code=code, stdout=out, timed_out=timed_out)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


async def test_healthcheck_start_period_failures_do_not_count() -> None:
    clock = Clock()
    sb = Scripted([(1, "", False)] * 3 + [(0, "ok", False)])
    spec = HealthcheckSpec(
        command="probe", start_period_s=2.0, start_interval_s=1.0, interval_s=3.0, retries=2
    )
    await run_healthcheck(sb, spec, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    # 0 s and 1 s fail in the start period (free), 2 s fails (1 of 2), 5 s passes: three
    # failures, with retries=2, and still healthy
    assert clock.sleeps == [1.0, 1.0, 3.0]
    assert sb.calls[0] == ("probe", 30.0, "root")


async def test_healthcheck_fails_after_retries_with_its_output() -> None:
    clock = Clock()
    sb = Scripted([(1, "first", False), (None, "", True), (7, "db refused", False)])
    spec = HealthcheckSpec(command=("pg_isready", "-h", "db"), interval_s=0.5, retries=3)
    with pytest.raises(SandboxHealthcheckError) as err:
        await run_healthcheck(sb, spec, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    assert err.value.output == "db refused"
    assert "failed 3 times in a row" in str(err.value)
    assert "exit code 7" in str(err.value) and "pg_isready -h db" in str(err.value)
    assert clock.sleeps == [0.5, 0.5]


async def test_null_backend_create_waits_for_the_healthcheck() -> None:
    backend = NullBackend()
    bad = SandboxSpec(healthcheck=HealthcheckSpec(command="false", interval_s=0, retries=2))
    with pytest.raises(SandboxHealthcheckError):
        await backend.create(bad)
    assert backend.live == set()  # closed, not leaked
    good = SandboxSpec(healthcheck=HealthcheckSpec(command="true"))
    sb = await backend.create(good)
    await sb.close()


# -- Terminal-Bench 1: the harness's client container, tmpfs/dns/extra_hosts, anonymous volumes --


def test_tbench_main_service_is_the_one_the_harness_attaches_to(tmp_path: Path) -> None:
    """Terminal-Bench's harness gets the agent's container by its container_name
    (`${T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME}`), whatever the service is called
    (home-server-https calls it `webserver`)."""
    compose = TB1_COMPOSE.replace("      client:\n", "      webserver:\n")
    task = load_task_dir(tb1_task(tmp_path, compose))
    assert task.environment.service_name == "webserver"
    assert [s.name for s in task.environment.services] == ["server"]
    assert sandbox_spec_for(task).service_name == "webserver"
    # two services claiming the client's container name: refused by name
    twice = compose.replace(
        "        image: ${T_BENCH_TASK_DOCKER_NAME_PREFIX}__server\n",
        "        image: ${T_BENCH_TASK_DOCKER_NAME_PREFIX}__server\n"
        "        container_name: ${T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME}\n",
    )
    with pytest.raises(TaskLoadError, match="expected one service with container_name"):
        load_task_dir(tb1_task(tmp_path / "twice", twice))


MAIN_SETTINGS = (
    "        tmpfs:\n"
    "          - /root:size=100M,mode=755\n"
    "          - /scratch\n"
    "        dns:\n"
    "          - 192.0.2.1\n"
    "        extra_hosts:\n"
    '          - "example.com:131.25.18.2"\n'
    '          - "v6.example=::1"\n'
)


def test_tbench_tmpfs_dns_extra_hosts_reach_the_sandbox_spec(tmp_path: Path) -> None:
    """extract-safely and oom mount a tmpfs on the client, broken-networking gives it a DNS
    server and /etc/hosts lines: loaded, carried to the SandboxSpec, and turned into the docker
    host config (the verifier's container: the tmpfs only, it shares the sandbox's network)."""
    from sandgym.sandboxes.docker.confine import Confinement

    compose = TB1_COMPOSE.replace("        depends_on: [server]\n", MAIN_SETTINGS)
    task = load_task_dir(tb1_task(tmp_path, compose))
    env = task.environment
    assert env.tmpfs == (("/root", "size=100M,mode=755"), ("/scratch", ""))
    assert env.dns == ("192.0.2.1",)
    assert env.extra_hosts == (("example.com", "131.25.18.2"), ("v6.example", "::1"))
    spec = sandbox_spec_for(task)
    assert (spec.tmpfs, spec.dns, spec.extra_hosts) == (env.tmpfs, env.dns, env.extra_hosts)
    assert Confinement.main_container(spec) == {
        "tmpfs": {"/root": "size=100M,mode=755", "/scratch": ""},
        "dns": ["192.0.2.1"],
        "extra_hosts": {"example.com": "131.25.18.2", "v6.example": "::1"},
    }
    assert Confinement.main_container(spec, verifier=True) == {
        "tmpfs": {"/root": "size=100M,mode=755", "/scratch": ""}
    }
    # they change what sandbox is made, so they change the fingerprint; without them the
    # fingerprint is the one of a spec that never had the fields
    plain = sandbox_spec_for(load_task_dir(tb1_task(tmp_path / "plain", TB1_COMPOSE)))
    assert spec.fingerprint("docker") != plain.fingerprint("docker")
    assert "tmpfs" not in plain.model_dump(exclude_defaults=True)
    for key in ("tmpfs", "dns", "extra_hosts"):
        one = plain.model_copy(update={key: getattr(spec, key)})
        assert one.fingerprint("docker") != plain.fingerprint("docker"), key


@pytest.mark.parametrize(
    ("service", "needle"),
    [
        ("tmpfs: [/cache]", "on the main service's container only"),
        ("dns: [192.0.2.1]", "on the main service's container only"),
        ("extra_hosts: ['a:1.2.3.4']", "on the main service's container only"),
        ("networks: {default: {ipv4_address: 172.20.0.10}}", "which fixes no subnet"),
    ],
)
def test_settings_beside_the_main_service_are_refused_by_name(
    tmp_path: Path, service: str, needle: str
) -> None:
    compose = f"services:\n  main: {{}}\n  db:\n    image: postgres:15\n    {service}\n"
    with pytest.raises(ComposeUnsupportedError) as err:
        load_task_dir(harbor_task(tmp_path, compose))
    assert needle in str(err.value) and "service 'db'" in str(err.value), err.value


@pytest.mark.parametrize(
    ("main", "needle"),
    [
        ("tmpfs: [cache]", "expected an absolute container path"),
        ("extra_hosts: [nohost]", "expected 'host:address'"),
        ("dns: {a: 1}", "expected an address or a list"),
        ("volumes: [/data]", "anonymous volume on the main service is not supported"),
    ],
)
def test_bad_main_settings_are_refused_by_name(tmp_path: Path, main: str, needle: str) -> None:
    compose = f"services:\n  main:\n    {main}\n"
    with pytest.raises(ComposeUnsupportedError) as err:
        load_task_dir(harbor_task(tmp_path, compose))
    assert needle in str(err.value), err.value


def test_an_anonymous_volume_beside_the_main_service(tmp_path: Path) -> None:
    """security-vulhub-minio gives each minio node `volumes: [/mnt/dataN]`: a fresh volume of
    its own, which the docker group creates with the container (and removes with it)."""
    compose = (
        "services:\n  main: {}\n  node1:\n    image: minio:1\n    volumes:\n"
        "      - /mnt/data1\n      - {type: volume, target: /mnt/extra}\n"
    )
    task = load_task_dir(harbor_task(tmp_path, compose))
    (node,) = task.environment.services
    assert node.volumes == ("/mnt/data1", "/mnt/extra")
    plain = ServiceSpec(name="node1", image="minio:1")
    assert "volumes" not in plain.fingerprint_data()  # unchanged keys without them
    assert node.fingerprint_data() != plain.fingerprint_data()
    with pytest.raises(ValueError, match="must be absolute"):
        ServiceSpec(name="n", image="x", volumes=("data",))


async def test_backends_other_than_docker_refuse_container_settings(tmp_path: Path) -> None:
    from sandgym.sandboxes.docker import DockerBackend
    from sandgym.sandboxes.local import LocalBackend

    for key, value in (
        ("tmpfs", (("/root", "size=1M"),)),
        ("dns", ("192.0.2.1",)),
        ("extra_hosts", (("a", "1.2.3.4"),)),
    ):
        spec = SandboxSpec(**{key: value})  # type: ignore[arg-type]
        null = NullBackend()
        with pytest.raises(SandboxGroupUnsupportedError, match=f"container settings \\['{key}'"):
            await null.create(spec)
        assert null.created == 0
        with pytest.raises(SandboxGroupUnsupportedError, match="local backend cannot honour"):
            await LocalBackend(root=tmp_path / "local").create(spec)
        DockerBackend.check_services(DockerBackend.__new__(DockerBackend), spec)  # accepted
    with pytest.raises(ValueError, match="tmpfs target must be absolute"):
        SandboxSpec(tmpfs=(("root", ""),))
