"""`bench harbor_compat`'s substitution layer (the rewrite and its records), the
"needs a host unreachable here" classification and the reachable-only figures, and resuming a
run from its JSONL stream (on the null backend: no Docker)."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from lab.bench import harbor_compat as hc
from lab.bench import substitutions as sb

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"

TB2_TEST_SH = """#!/bin/bash

# Install curl
apt-get update
apt-get install -y curl

# Install uv
curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh

source $HOME/.local/bin/env

uvx \\
  -p 3.13 \\
  -w pytest==8.4.1 \\
  -w pytest-json-ctrf==0.3.5 \\
  pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA

if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""

DEBS = {"3.13": ["pool/main/p/python3.13/python3.13-minimal_3.13.5_amd64.deb"]}


def test_uv_installer_is_replaced_by_the_pypi_wheel_and_recorded() -> None:
    new, recs = sb.rewrite_script(TB2_TEST_SH, cpython_debs=DEBS)
    assert [r["name"] for r in recs] == ["uv-installer-from-pypi", "uv-python-from-debian"]
    assert recs[0]["original"] == "curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh"
    assert "astral.sh" not in new
    assert "https://pypi.org/simple/uv/" in new and '_sg_v="0.9.5"' in new
    assert "UV_PYTHON_DOWNLOADS=never" in new
    assert "http://deb.debian.org/debian/pool/main/p/python3.13/" in new
    # what the verifier runs and checks is untouched: every other line is as it was
    kept = [ln for ln in TB2_TEST_SH.splitlines() if "astral.sh" not in ln]
    assert [ln for ln in new.splitlines() if "sandgym" not in ln and "_sg_" not in ln] == kept


def test_no_substitution_without_an_unreachable_fetch() -> None:
    text = "#!/bin/bash\npip install pytest\npytest /tests -rA\ncurl https://pypi.org/simple/\n"
    assert sb.rewrite_script(text) == (text, [])
    # an installer without a pinned version, piped into bash, with an env prefix
    new, recs = sb.rewrite_script(
        "wget -qO- https://astral.sh/uv/install.sh | env UV_INSTALL_DIR=/opt/uv sh\n"
    )
    assert [r["name"] for r in recs] == ["uv-installer-from-pypi"]
    assert '_sg_v=""' in new and "export UV_INSTALL_DIR=/opt/uv" in new
    # a CPython version no Debian release ships: downloads off, no packages, and it says so
    new, recs = sb.rewrite_script(
        "curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh\nuvx -p 3.12 pytest\n",
        cpython_debs={},
    )
    assert "UV_PYTHON_DOWNLOADS=never" in new and "dpkg-deb" not in new
    assert "github.com (unreachable here)" in new


def test_prepare_task_copy_rewrites_a_copy_and_names_the_file(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "harbor-legacy", src)
    (src / "tests" / "test.sh").write_text(TB2_TEST_SH)
    before = {p.relative_to(src): p.read_bytes() for p in src.rglob("*") if p.is_file()}
    dst = tmp_path / "work" / "t"
    recs = sb.prepare_task_copy(src, dst, DEBS)
    assert {r["file"] for r in recs} == {"tests/test.sh"}
    assert {r["name"] for r in recs} == {"uv-installer-from-pypi", "uv-python-from-debian"}
    # the original is untouched; the copy differs only in the rewritten script
    assert {p.relative_to(src): p.read_bytes() for p in src.rglob("*") if p.is_file()} == before
    for rel, data in before.items():
        if str(rel) != "tests/test.sh":
            assert (dst / rel).read_bytes() == data
    assert "astral.sh" not in (dst / "tests" / "test.sh").read_text()


def test_unreachable_hosts_are_told_from_reachable_ones() -> None:
    assert sb.unreachable_hosts("curl: (6) Could not resolve host: github.com") == ["github.com"]
    assert sb.unreachable_hosts("GET https://huggingface.co/x/resolve/main/m.bin failed") == [
        "huggingface.co"
    ]
    assert sb.unreachable_hosts("Get:1 http://deb.debian.org/debian trixie InRelease") == []
    assert sb.unreachable_hosts("https://files.pythonhosted.org/packages/uv.whl") == []


def _entry(**kw: Any) -> dict[str, Any]:
    e: dict[str, Any] = {
        "task_id": "t",
        "oracle_shipped": True,
        "env_builds": True,
        "oracle_reward": 1.0,
        "noop_reward": 0.0,
        "error": None,
    }
    e.update(kw)
    return e


def _judged(**kw: Any) -> tuple[list[str], Any]:
    return hc.judge(_entry(**kw))


def test_a_host_leaves_the_denominator_only_when_its_phase_fetches_it_and_its_output_names_it() -> (
    None
):
    clone = (
        "SandboxCreateError: building: fatal: unable to access "
        "'https://github.com/a/b.git/': Could not resolve host: github.com"
    )
    build = dict(env_builds=False, build_error=clone, build_reason="build_network")
    reasons, out = _judged(
        **build, referenced_unreachable_hosts={"environment/Dockerfile": ["github.com"]}
    )
    assert reasons == ["needs_unreachable_host", "build_network"]
    assert out.category == "unreachable_host" and out.evidence is not None
    assert (out.evidence.needs, out.evidence.phase, out.evidence.file) == (
        "github.com",
        "build",
        "environment/Dockerfile",
    )
    # the output names the host, but no file of the build fetches it: no evidence, a failure
    reasons, out = _judged(**build, referenced_unreachable_hosts={"tests/test.sh": ["github.com"]})
    assert reasons == ["build_network"] and out.category == "failing"
    # docker build's coloured stderr splits the host name
    coloured = dict(
        build,
        build_error="\x1b[91mc\x1b[0m\x1b[91mu\x1b[0mrl: (6) Could not resolve host: r\x1b[0m"
        "\x1b[91maw.\x1b[0m\x1b[91mg\x1b[0mithubusercontent.com",
    )
    refs = {"environment/Dockerfile": ["raw.githubusercontent.com"]}
    _, out = _judged(**coloured, referenced_unreachable_hosts=refs)
    assert out.evidence is not None and out.evidence.needs == "raw.githubusercontent.com"
    # a quiet download: the failed step is the output line that names the host
    quiet = dict(
        build,
        build_error="Step 4/13 : RUN cd /build && wget -q https://github.com/x/y.tar.gz\n"
        " ---> Running in 245a4526e47c\nThe command '/bin/sh -c cd /build && wget -q "
        "https://github.com/x/y.tar.gz' returned a non-zero code: 4",
    )
    _, out = _judged(
        **quiet, referenced_unreachable_hosts={"environment/Dockerfile": ["github.com"]}
    )
    assert out.category == "unreachable_host"
    # the solution's download, seen in the oracle's output; the solution fetches it
    data = dict(
        oracle_reward=0.0,
        oracle_output="OSError: We couldn't connect to 'https://huggingface.co' to load "
        "this file\nrequests.exceptions.ConnectionError: Max retries exceeded",
    )
    reasons, out = _judged(
        **data, referenced_unreachable_hosts={"solution/solve.sh": ["huggingface.co"]}
    )
    assert reasons == ["needs_unreachable_host", "oracle_below_one"]
    # ... but a host only the tests name does not explain the solution's failure
    _, out = _judged(
        **data, referenced_unreachable_hosts={"tests/test_outputs.py": ["huggingface.co"]}
    )
    assert out.category == "failing"
    # a failure on a reachable host is the sandbox's network (infra), not such a need; a task
    # that merely names an unreachable host does not need it
    pypi = _entry(
        oracle_reward=0.0,
        oracle_output="ERROR: Could not fetch https://pypi.org/simple/x: Connection refused",
    )
    assert hc.verdict(pypi) == ["infra"]
    named = _entry(noop_reward=1.0, noop_verifier_output="see https://github.com/x/y")
    assert hc.judge(named)[0] == ["noop_nonzero"]
    clean = _entry(oracle_output="cloned https://github.com/x/y fine")
    assert hc.judge(clean)[0] == [] and hc.judge(clean)[1].category == "clean"


def test_a_lookup_failure_naming_no_host_stays_a_failure() -> None:
    refs = {"tests/test_outputs.py": ["github.com"], "solution/solve.sh": ["cloud.r-project.org"]}
    test_dl = _entry(
        oracle_reward=0.0,
        referenced_unreachable_hosts=refs,
        oracle_verifier_output="E   urllib.error.URLError: <urlopen error [Errno -2] Name or "
        "service not known>",
    )
    reasons, out = hc.judge(test_dl)
    assert reasons == ["oracle_below_one"] and out.category == "failing"
    cran = _entry(
        oracle_reward=0.0,
        referenced_unreachable_hosts=refs,
        oracle_output="package 'remotes' is not available for this version of R",
    )
    assert hc.judge(cran)[1].category == "failing"
    # urllib3 quotes the host it failed to resolve: named, and the solution fetches it
    quoted = _entry(
        oracle_reward=0.0,
        referenced_unreachable_hosts={"solution/solve.py": ["pubchem.ncbi.nlm.nih.gov"]},
        oracle_output="requests.exceptions.ConnectionError: HTTPSConnectionPool(host='pubchem."
        "ncbi.nlm.nih.gov', port=443): Max retries exceeded (Caused by NameResolutionError("
        "\"Failed to resolve 'pubchem.ncbi.nlm.nih.gov' ([Errno -2] Name or service not known)\"))",
    )
    _, out = hc.judge(quoted)
    assert out.evidence is not None and out.evidence.needs == "pubchem.ncbi.nlm.nih.gov"
    # a host a substitution replaced in that very file is no evidence
    subst = [{"name": "uv-installer-from-pypi", "original": "curl https://astral.sh/uv/install.sh",
              "file": "tests/test.sh"}]  # fmt: skip
    uv = _entry(
        oracle_reward=0.0,
        substitutions=subst,
        referenced_unreachable_hosts={"tests/test.sh": ["astral.sh"]},
        oracle_verifier_output="curl: (6) Could not resolve host: astral.sh",
    )
    assert hc.judge(uv)[1].category == "failing"


def test_stand_in_limits_bit_rot_and_incomplete_copies_each_get_their_own_line() -> None:
    # Ubuntu's CPython 3.12 on the Debian stand-in of ubuntu:24.04
    py = _entry(
        base_image="ubuntu:24.04",
        oracle_reward=0.0,
        oracle_verifier_output="error: No interpreter found for Python 3.12 in managed "
        "installations or search path",
    )
    reasons, out = hc.judge(py)
    assert reasons == ["stand_in_limit", "oracle_below_one"]
    assert out.category == "stand_in_limit" and "real Ubuntu 24.04" in out.action
    # an Ubuntu pin on its stand-in
    pinned = _entry(
        base_image="ubuntu:24.04",
        env_builds=False,
        build_reason="build_apt_package_missing",
        build_error="\x1b[91mE: Version '2023.20240207-1' for 'texlive-latex-base' was not found",
    )
    assert hc.judge(pinned)[1].category == "stand_in_limit"
    # broken-networking (Terminal-Bench 1) installs Ubuntu's apt .deb on the ubuntu:22.04
    # stand-in (Debian), whose archive has no ubuntu-keyring
    keyring = _entry(
        base_image="ubuntu:22.04",
        oracle_reward=0.0,
        oracle_output=" apt : Depends: ubuntu-keyring but it is not installable\n",
    )
    _, out = hc.judge(keyring)
    assert out.category == "stand_in_limit" and "real Ubuntu 22.04" in out.action
    assert out.evidence is not None and "ubuntu-keyring" in out.evidence.output_line
    assert hc.judge(dict(keyring, base_image="python:3.13-slim"))[1].category == "failing"
    # 3.13 is no Ubuntu 24.04 CPython: not the stand-in's limit
    assert (
        hc.judge(dict(py, oracle_verifier_output="No interpreter found for Python 3.13"))[
            1
        ].category
        == "failing"
    )
    # bit-rot: a pin the Debian mirror of the very release no longer has is a failure
    rot = _entry(
        base_image="debian:13.0-slim",
        oracle_reward=0.0,
        oracle_output="E: Version '20250419' for 'ca-certificates' was not found",
    )
    reasons, out = hc.judge(rot)
    assert reasons == ["oracle_below_one"] and out.category == "failing"
    assert out.action.startswith("bit-rot: the task pins ca-certificates=20250419")
    absent = _entry(oracle_reward=0.0, absent_files=["tests/weights.pt"])
    reasons, out = hc.judge(absent)
    assert reasons[0] == "dataset_incomplete" and out.category == "dataset_incomplete"
    assert "tests/weights.pt" in out.action


def test_reachable_figures_leave_unreachable_needs_out() -> None:
    ok = _entry(task_id="ok", substitutions=[{"name": "uv-installer-from-pypi"}])
    bad = _entry(task_id="bad", oracle_reward=0.0)
    far = _entry(task_id="far", oracle_reward=0.0, absent_files=["x"])
    img = _entry(
        task_id="img",
        oracle_reward=0.0,
        oracle_output="curl: (6) Could not resolve host: huggingface.co",
        referenced_unreachable_hosts={"solution/solve.sh": ["huggingface.co"]},
    )
    entries = [ok, bad, far, img]
    for e in entries:
        e["reasons"], out = hc.judge(e)
        e["outcome"] = out.model_dump()
    s = hc.summarize(entries)
    assert s["table"] == {
        "clean": 1,
        "failing": 1,
        "unreachable_host": 1,
        "stand_in_limit": 0,
        "dataset_incomplete": 1,
    }
    assert s["absolute_clean"] == {"count": 1, "of": 4, "share": 0.25}
    r = s["reachable"]
    assert r["tasks"] == 2
    assert r["oracle_one_noop_zero"] == {"count": 1, "of": 2, "share": 0.5}
    assert [x["task_id"] for x in s["shortfalls"]] == ["bad", "far", "img"]
    assert s["substituted"] == {
        "tasks": 1,
        "by_substitution": {"uv-installer-from-pypi": 1},
        "clean": 1,
        "clean_without_substitution": 0,
    }


def test_stored_lines_keep_the_reasons_their_run_recorded(tmp_path: Path) -> None:
    """The report never classifies a stored line again: an older line (no `outcome`) is read by
    the reasons it recorded, whatever today's rules would make of its outputs."""
    # recorded as a failure; today's rules would find evidence of an unreachable host in it
    failed = _entry(
        task_id="t1",
        dataset="A",
        oracle_reward=0.0,
        oracle_output="curl: (6) Could not resolve host: huggingface.co",
        referenced_unreachable_hosts={"solution/solve.sh": ["huggingface.co"]},
        reasons=["oracle_below_one"],
    )
    assert hc.judge(failed)[1].category == "unreachable_host"
    # recorded as needing a host, by an older rule that today's would not accept
    excluded = _entry(
        task_id="t2",
        dataset="A",
        oracle_reward=0.0,
        reasons=["needs_unreachable_host", "oracle_below_one"],
        unreachable_hosts=["cloud.r-project.org"],
        code_commit="abc123",
    )
    assert hc.judge(excluded)[1].category == "failing"
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text(json.dumps(failed) + "\n" + json.dumps(excluded) + "\n")
    a = tmp_path / "a"
    for n in ("t1", "t2"):
        (a / n).mkdir(parents=True)
    args = _args(
        tmp_path, "--tasks-dir", str(a), "--source-name", "A", "--jsonl", str(jsonl),
        "--report-only",
    )  # fmt: skip
    earlier, plans = hc._prepare(args)
    doc = hc.build_document(args, plans, earlier, {}, None)
    (ds,) = doc["datasets"]
    assert ds["summary"]["table"]["failing"] == 1
    assert ds["summary"]["table"]["unreachable_host"] == 1
    rows = {r["task_id"]: r for r in ds["summary"]["shortfalls"]}
    assert rows["t1"]["category"] == "failing"
    assert rows["t2"]["category"] == "unreachable_host"
    assert rows["t2"]["classified_by"] == "abc123"
    assert rows["t1"]["classified_by"].startswith("not recorded")
    assert ds["summary"]["reachable"]["tasks"] == 1


def _args(tmp_path: Path, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    hc.add_arguments(parser)
    return parser.parse_args(
        [*argv, "--backend", "null", "--infra-retries", "0", "--work-dir", str(tmp_path / "w")]
    )


async def test_compat_run_streams_to_jsonl_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = tmp_path / "a"
    b = tmp_path / "b"
    for root, names in ((a, ["a1", "a2", "a3"]), (b, ["b1", "b2"])):
        root.mkdir()
        for n in names:
            shutil.copytree(FIXTURES / "harbor-legacy", root / n)
    (a / "a2" / "tests" / "test.sh").write_text(TB2_TEST_SH)
    calls: list[str] = []

    async def fake(task: Any, backend: Any, image_map: Any, t: Any, r: Any, item: Any) -> Any:
        calls.append(f"{item.dataset}/{task.id}")
        e = _entry(task_id=task.id, dataset=item.dataset, substitutions=item.substitutions)
        e["reasons"] = hc.verdict(e)
        e["duration_s"] = 0.0
        return e

    monkeypatch.setattr(hc, "_check_one", fake)
    monkeypatch.setattr(sb, "debian_cpython_debs", lambda v, d: DEBS.get(v))
    jsonl = tmp_path / "run.jsonl"
    base = [
        "--tasks-dir", str(a), "--source-name", "A", "--source-sample", "2:5",
        "--tasks-dir", str(b), "--source-name", "B", "--source-sample", "",
        "--jsonl", str(jsonl), "--substitute",
    ]  # fmt: skip
    # a first run that is cut off after two tasks
    real_gather = hc.asyncio.gather

    async def two_only(*aws: Any) -> Any:
        for c in aws[2:]:
            c.close()
        return await real_gather(*aws[:2])

    monkeypatch.setattr(hc.asyncio, "gather", two_only)
    doc = await hc.run_compat(_args(tmp_path, *base))
    monkeypatch.setattr(hc.asyncio, "gather", real_gather)
    assert doc["complete"] is False and doc["tasks_selected"] == 4 and doc["tasks_run"] == 2
    # interleaved: one task of each dataset first
    assert [c.split("/")[0] for c in calls] == ["A", "B"]
    assert len(jsonl.read_text().splitlines()) == 2
    first = list(calls)
    doc = await hc.run_compat(_args(tmp_path, *base, "--resume"))
    assert doc["complete"] is True and doc["tasks_run"] == 4
    assert len(calls) == 4 and not set(calls[2:]) & set(first)  # nothing ran twice
    by_name = {d["name"]: d for d in doc["datasets"]}
    assert by_name["A"]["tasks_selected"] == 2 and by_name["B"]["tasks_selected"] == 2
    assert by_name["A"]["source"]["selection"] == "2:5"
    lines = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert len(lines) == 4
    # the seeded sample is the same in both runs, and substitutions travel with the entries
    sub = [e for e in lines if e["substitutions"]]
    assert [e["task_id"] for e in sub] == ["a2"], "the rewritten task carries no substitution"
    for e in sub:
        assert e["task_id"] == "a2" and e["substitutions"][0]["file"] == "tests/test.sh"
    # report-only rebuilds the same figures without running anything
    n = len(calls)
    again = await hc.run_compat(_args(tmp_path, *base, "--report-only"))
    assert len(calls) == n and again["summary"] == doc["summary"]
    # every line a run writes names the commit that checked it
    assert all(e["code_commit"] and e["checked_at"] for e in lines)
    assert sum(again["entries_by_commit"].values()) == 4


async def test_rerun_checks_named_tasks_again_and_keeps_the_earlier_runs_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = tmp_path / "a"
    a.mkdir()
    for n in ("t1", "t2", "t3"):
        shutil.copytree(FIXTURES / "harbor-legacy", a / n)
    calls: list[str] = []
    reward = {"t1": 0.0}

    async def fake(task: Any, backend: Any, image_map: Any, t: Any, r: Any, item: Any) -> Any:
        calls.append(task.id)
        e = _entry(task_id=task.id, dataset=item.dataset, oracle_reward=reward.get(task.id, 1.0))
        e["reasons"] = hc.verdict(e)
        e["duration_s"] = 0.0
        return e

    monkeypatch.setattr(hc, "_check_one", fake)
    jsonl, out = tmp_path / "run.jsonl", tmp_path / "run.json"
    base = ["--tasks-dir", str(a), "--source-name", "A", "--jsonl", str(jsonl), "--out", str(out)]
    from lab.bench.report import save_json

    first = await hc.run_compat(_args(tmp_path, *base))
    save_json(first, out)
    assert first["summary"]["clean"]["count"] == 2 and sorted(calls) == ["t1", "t2", "t3"]
    old_line = [json.loads(x) for x in jsonl.read_text().splitlines() if '"t1"' in x]
    # an old line without the commit field (as a run before this field wrote it)
    old_line[0].pop("code_commit")
    jsonl.write_text(
        "".join(
            json.dumps(old_line[0]) + "\n" if '"t1"' in x else x + "\n"
            for x in jsonl.read_text().splitlines()
        )
    )
    calls.clear()
    reward["t1"] = 1.0  # the fix
    doc = await hc.run_compat(_args(tmp_path, *base, "--resume", "--rerun", "A/t1"))
    assert calls == ["t1"]  # only the named task ran again
    assert doc["summary"]["clean"]["count"] == 3
    lines = jsonl.read_text().splitlines()
    assert len(lines) == 4  # the old line stays in the raw data, the new one wins in the report
    by_commit = doc["entries_by_commit"]
    assert "not recorded" not in by_commit and sum(by_commit.values()) == 3
    assert doc["earlier_provenance"] == [first["provenance"]]
    # without --rerun, a resumed run leaves every task alone
    calls.clear()
    await hc.run_compat(_args(tmp_path, *base, "--resume"))
    assert calls == []
    # a task named again runs before those not yet run (t0 sorts first)
    for n in ("t0", "t4"):
        shutil.copytree(FIXTURES / "harbor-legacy", a / n)
    one = ("--concurrency", "1")
    await hc.run_compat(_args(tmp_path, *base, *one, "--resume", "--rerun", "t3"))
    assert calls == ["t3", "t0", "t4"]


def test_engine_failures_are_infra_and_run_again_on_resume(tmp_path: Path) -> None:
    err = (
        "SandboxCreateError: building x/Dockerfile failed: failed to create endpoint c on "
        "network bridge: adding interface veth1 to bridge docker0 failed: could not find "
        "bridge docker0: route ip+net: no such network interface"
    )
    assert hc.classify_build_error(err) == "infra"
    store = (  # a step's layer image removed under the build (seen at concurrency 2, pruning)
        "SandboxCreateError: building t/environment/Dockerfile failed: failed to get digest "
        "sha256:80c18be1: open /var/lib/sandgym-docker/image/btrfs/imagedb/content/sha256/"
        "80c18be1: no such file or directory\n--- build log tail ---\nSetting up gcc (4:14.2.0-1)"
    )
    assert hc.classify_build_error(store) == "infra"
    assert hc.classify_build_error(store.replace("imagedb", "layerdb")) == "build_other"
    old = _entry(
        task_id="t1",
        dataset="A",
        env_builds=False,
        build_error=err,
        build_reason="build_other",  # as an older classification recorded it
        reasons=["build_other"],
    )
    old["reasons"] = ["infra"]  # as its run recorded it
    good = _entry(task_id="t2", dataset="A", reasons=[])
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text(json.dumps(old) + "\n" + json.dumps(good) + "\n")
    a = tmp_path / "a"
    a.mkdir()
    for n in ("t1", "t2"):
        shutil.copytree(FIXTURES / "harbor-legacy", a / n)
    args = _args(
        tmp_path, "--tasks-dir", str(a), "--source-name", "A", "--jsonl", str(jsonl), "--resume"
    )
    earlier, plans = hc._prepare(args)
    assert [e["task_id"] for e in earlier] == ["t2"]  # t1 runs again


def test_resume_counts_only_the_tasks_left_with_no_line_as_run_again() -> None:
    """A task whose engine-failed line was superseded by a later run keeps that later line and
    is not among those a resumed run runs again (the count its log line gives)."""
    lost = _entry(task_id="t1", dataset="A", reasons=["infra"])
    superseded = _entry(task_id="t2", dataset="A", reasons=["infra"])
    later = _entry(task_id="t2", dataset="A", reasons=[])
    kept, again = hc.drop_infra_only([lost, superseded, later])
    assert [(e["task_id"], e["reasons"]) for e in kept] == [("t2", [])]
    assert again == {("A", "t1")}


def test_a_reachable_host_that_did_not_answer_is_infra() -> None:
    lost = _entry(
        oracle_reward=0.0,
        oracle_verifier_output="curl: (7) Failed to connect to deb.debian.org port 80\n"
        "error: No interpreter found for Python 3.13 in managed installations",
    )
    assert hc.verdict(lost) == ["infra"] and hc.infra_only({"reasons": hc.verdict(lost)})
    build = _entry(
        env_builds=False,
        build_error="E: Failed to fetch http://deb.debian.org/x.deb  Unable to connect to "
        "deb.debian.org:http: [IP: 203.0.113.80 80]",
        build_reason="build_network",
    )
    assert hc.verdict(build) == ["infra"]
    gone = _entry(oracle_reward=0.0, oracle_output="E: Failed to fetch http://deb.debian.org/x 404")
    assert hc.verdict(gone) == ["oracle_below_one"]  # a 404 is an answer


def test_uv_registry_image_is_copied_from_the_local_stand_in() -> None:
    text = (
        "FROM python:3.13-slim-bookworm\n"
        "COPY --from=ghcr.io/astral-sh/uv:0.8.15 /uv /uvx /bin/\n"
        "COPY --from=ghcr.io/other/tool:1.0 /x /bin/\n"
    )
    new, recs = sb.rewrite_script(text, is_dockerfile=True)
    assert "COPY --from=sandgym/subst-uv:0.8.15 /uv /uvx /bin/" in new
    assert "COPY --from=ghcr.io/other/tool:1.0 /x /bin/" in new  # only uv's image
    assert recs == [
        {
            "name": "uv-image-from-pypi",
            "original": "COPY --from=ghcr.io/astral-sh/uv:0.8.15",
            "version": "0.8.15",
        }
    ]
    # a shell script is not a Dockerfile: left alone
    assert sb.rewrite_script(text, is_dockerfile=False) == (text, [])


def test_a_zero_limit_gives_each_task_its_own_limits() -> None:
    from sandgym.tasks import load_task_dir

    task = load_task_dir(FIXTURES / "harbor-legacy")
    assert hc.task_limit_s(task, 600.0) == 600.0
    t = task.timeouts
    own = t.build_timeout_s + t.agent_timeout_s + 2 * t.verifier_timeout_s + hc.LIMIT_SLACK_S
    assert hc.task_limit_s(task, 0) == own
    longer = task.model_copy(
        update={"timeouts": t.model_copy(update={"agent_timeout_s": t.agent_timeout_s + 1000})}
    )
    assert hc.task_limit_s(longer, 0) == own + 1000


def test_a_failed_download_early_in_a_long_oracle_output_is_still_seen() -> None:
    from lab.bench.harbor_compat import network_failure_lines

    out = (
        "Downloading model...\n"
        "OSError: We couldn't connect to 'https://huggingface.co' to load the files\n"
        + "flask log line\n" * 5000
        + "requests.exceptions.ConnectionError: HTTPConnectionPool(host='localhost', port=5000)"
    )
    lines = network_failure_lines(out)
    assert lines[0].startswith("OSError: We couldn't connect to 'https://huggingface.co'")
    tail_only = _entry(oracle_reward=0.0, oracle_output=out[-1500:])
    assert hc.verdict(tail_only) == ["oracle_below_one"]  # the tail names only localhost
    whole = dict(
        tail_only,
        oracle_network_lines=lines,
        referenced_unreachable_hosts={"solution/solve.sh": ["huggingface.co"]},
    )
    assert hc.judge(whole)[0] == ["needs_unreachable_host", "oracle_below_one"]
    assert hc.judge(whole)[1].evidence.needs == "huggingface.co"
    assert len(network_failure_lines("x: Connection timed out\n" * 500)) == 1  # distinct lines


def test_uv_failing_to_reach_pypi_is_infra() -> None:
    out = (
        "error: Failed to fetch: `https://pypi.org/simple/pytest/`\n"
        "  Caused by: Request failed after 3 retries\n"
        "  Caused by: error sending request for url (https://pypi.org/simple/pytest/)\n"
        "  Caused by: client error (Connect)\n  Caused by: dns error\n"
        "  Caused by: failed to lookup address information: Temporary failure in name resolution"
    )
    lost = _entry(oracle_reward=0.0, oracle_verifier_output=out)
    assert hc.verdict(lost) == ["infra"]
    # a package that does not exist is no network failure
    missing = _entry(
        oracle_reward=0.0,
        oracle_verifier_output="error: Failed to fetch: `https://pypi.org/simple/nopkg/`\n"
        "  Caused by: HTTP status client error (404 Not Found)",
    )
    assert hc.verdict(missing) == ["oracle_below_one"]


def test_opam_failing_to_download_its_index_needs_opam_ocaml_org() -> None:
    line = (
        '[ERROR] Could not update repository "default": OpamDownload.Download_fail(_, "curl '
        'failed: \\"/usr/bin/curl --retry 3 -L -o /tmp/index.tar.gz.part -- '
        'https://opam.ocaml.org/index.tar.gz\\" exited with code 6")'
    )
    e = _entry(
        oracle_reward=0.0,
        oracle_output="...\n" + line + "\n[ERROR] Initial download",
        referenced_unreachable_hosts={"solution/solve.sh": ["opam.ocaml.org"]},
    )
    assert hc.judge(e)[0] == ["needs_unreachable_host", "oracle_below_one"]
    assert hc.judge(e)[1].evidence.needs == "opam.ocaml.org"
    # a download that failed for another reason (22: an HTTP error) is not a host out of reach
    other = dict(e, oracle_output=line.replace("code 6", "code 22"))
    assert hc.judge(other)[0] == ["oracle_below_one"]


def test_a_rebuilt_document_keeps_the_stand_ins_its_lines_ran_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--report-only` on another engine (stand-ins absent or rebuilt) names the images the
    document it rebuilds recorded, not this engine's."""
    ran_on = {"ubuntu:24.04": {"local_image": "ubuntu:24.04", "id": "sha256:87f5debecf12"}}
    out = tmp_path / "doc.json"
    out.write_text(json.dumps({"stand_in_images": ran_on, "provenance": {"git_commit": "x"}}))
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text(json.dumps(_entry(task_id="t1", dataset="A", reasons=[])) + "\n")
    (tmp_path / "a" / "t1").mkdir(parents=True)
    args = _args(
        tmp_path, "--tasks-dir", str(tmp_path / "a"), "--source-name", "A",
        "--jsonl", str(jsonl), "--report-only", "--out", str(out),
    )  # fmt: skip
    args.backend = "docker"
    rebuilt = {"ubuntu:24.04": {"local_image": "ubuntu:24.04", "id": "sha256:0cfdd3d64afe"}}
    monkeypatch.setattr(hc, "_stand_ins", lambda bases, image_map: rebuilt)
    earlier, plans = hc._prepare(args)
    assert hc.stand_ins_of(args, ["ubuntu:24.04"], {}) == ran_on
    args.report_only = False  # a run: this engine's images, which its new lines run on
    assert hc.stand_ins_of(args, ["ubuntu:24.04"], {}) == rebuilt


TB1_SETUP_UV = """#!/bin/bash
apt-get update
apt-get install -y curl
curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh
source $HOME/.local/bin/env
uv init
uv add pytest==8.4.1
"""


def test_terminal_bench_1_harness_scripts_and_multi_source_copies_are_rewritten_and_listed(
    tmp_path: Path,
) -> None:
    """Terminal-Bench 1's run-tests.sh sources tests/setup-uv-pytest.sh, which fetches uv from
    astral.sh: the uv substitution reaches it (before: `uv: command not found`); a BuildKit-only
    multi-source COPY is listed per task with the file it is in."""
    from sandgym.tasks import load_task_dir

    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "tbench-modern", src)
    (src / "tests" / "setup-uv-pytest.sh").write_text(TB1_SETUP_UV)
    (src / "tests" / "run-uv-pytest.sh").write_text("uv run pytest $TEST_DIR/test_outputs.py\n")
    (src / "deps").mkdir()
    for n in ("a.py", "b.py"):
        (src / "deps" / n).write_text(n)
    with (src / "Dockerfile").open("a") as fh:
        fh.write("COPY deps/* /app\n")
    recs = sb.prepare_task_copy(src, tmp_path / "work" / "t")
    assert [(r["name"], r["file"]) for r in recs] == [
        ("uv-installer-from-pypi", "tests/setup-uv-pytest.sh")
    ]
    text = (tmp_path / "work" / "t" / "tests" / "setup-uv-pytest.sh").read_text()
    assert "astral.sh" not in text and '_sg_v="0.7.13"' in text and "uv add pytest" in text
    assert hc.classic_builder_records(load_task_dir(src), src) == [
        {
            "name": "copy-dest-dir-for-classic-builder",
            "original": "COPY deps/* /app",
            "file": "Dockerfile",
        }
    ]
    assert "copy-dest-dir-for-classic-builder" in sb.SUBSTITUTIONS


def test_a_noto_font_download_comes_from_debians_fonts_noto_core() -> None:
    """chess-best-move fetches one Noto font from notofonts.github.io (unreachable); Debian's
    fonts-noto-core ships the file under the same name."""
    df = (
        "FROM ubuntu:24.04\nRUN mkdir -p /fonts\n"
        "RUN curl https://notofonts.github.io/symbols/fonts/NotoSansSymbols2/full/ttf/"
        "NotoSansSymbols2-Regular.ttf > /fonts/noto.ttf\nCOPY make.py /app\n"
    )
    new, recs = sb.rewrite_script(df, is_dockerfile=True)
    assert [(r["name"], r["font"]) for r in recs] == [
        ("noto-font-from-debian", "NotoSansSymbols2-Regular.ttf")
    ]
    assert "notofonts.github.io" not in new and "apt-get download fonts-noto-core" in new
    assert "./usr/share/fonts/truetype/noto/NotoSansSymbols2-Regular.ttf > /fonts/noto.ttf" in new
    assert new.startswith("FROM ubuntu:24.04\nRUN mkdir -p /fonts\nRUN { ")
    assert new.endswith("\nCOPY make.py /app\n")
    # a shell script is not rewritten this way (only Dockerfile steps are)
    assert sb.rewrite_script(df, is_dockerfile=False)[1] == []
    assert "noto-font-from-debian" in sb.SUBSTITUTIONS


def test_a_dockerfile_uv_run_gets_the_debian_cpython_its_script_requires(tmp_path: Path) -> None:
    """financial-document-processor's build runs `uv run` on a script whose inline metadata
    requires CPython 3.13: uv would download it from github.com. The step first gets the
    uv-python-from-debian interpreter, as the verifier scripts do."""
    (tmp_path / "randomize_filenames.py").write_text(
        '#!/usr/bin/env python3\n# /// script\n# requires-python = ">=3.13"\n# ///\nprint(1)\n'
    )
    df = (
        "FROM ubuntu:24.04 as build\n"
        "COPY --from=ghcr.io/astral-sh/uv:0.8.14 /uv /uvx /bin/\n"
        "COPY randomize_filenames.py /root\n"
        "RUN uv run /root/randomize_filenames.py\n"
        "RUN uvx -p 3.12 ruff --version\n"
        "RUN echo uv is here\n"
    )
    new, recs = sb.rewrite_script(df, is_dockerfile=True, cpython_debs=DEBS, context=tmp_path)
    names = [r["name"] for r in recs]
    assert names == ["uv-image-from-pypi", "uv-python-from-debian", "uv-python-from-debian"]
    assert "CPython 3.13" in recs[1]["original"] and "CPython 3.12" in recs[2]["original"]
    lines = new.splitlines()
    assert lines[3].startswith("RUN { command -v curl") and lines[3].endswith(
        "; uv run /root/randomize_filenames.py"
    )
    assert "UV_PYTHON_DOWNLOADS=never" in lines[3] and "python3.13-minimal" in lines[3]
    # /usr/local/bin/python3.13 starts the wrapper by its own path (a symlink made a venv of it
    # look for the standard library under /usr/local: "Failed to import encodings")
    assert (
        "printf '#!/bin/sh\\nexec /opt/sandgym-cpython-3.13/usr/bin/python3.13 \"$@\"\\n' "
        "> /usr/local/bin/python3.13" in lines[3]
    )
    assert "ln -sf" not in lines[3]
    assert "UV_PYTHON_DOWNLOADS=never" in lines[4] and lines[4].endswith(
        "; uvx -p 3.12 ruff --version"
    )
    assert lines[5] == "RUN echo uv is here"
    # without the script in the context, no version is known: the step is left as written
    bare, recs2 = sb.rewrite_script(
        df, is_dockerfile=True, cpython_debs=DEBS, context=tmp_path / "x"
    )
    assert "RUN uv run /root/randomize_filenames.py" in bare.splitlines()


def test_a_base_image_no_registry_serves_and_no_stand_in_replaces_leaves_the_denominator() -> None:
    err = (
        "SandboxCreateError: building /t/Dockerfile failed: pull access denied for "
        "localstack/localstack, repository does not exist or may require 'docker login'"
    )
    e = _entry(
        base_image="localstack/localstack:4.3",
        env_builds=False,
        build_error=err,
        build_reason="base_image_unavailable",
    )
    reasons, out = hc.judge(e)
    assert reasons == ["needs_unreachable_host", "base_image_unavailable"]
    assert out.evidence is not None and out.evidence.needs.startswith("registry-1.docker.io")
    ghcr = dict(e, base_image="ghcr.io/x/y:1")
    assert hc.judge(ghcr)[1].evidence.needs.startswith("ghcr.io (the base image ghcr.io/x/y:1")
    # a build that failed for another reason on that image is no such evidence
    other = dict(e, build_reason="build_other", build_error="E: Sub-process returned 100")
    assert hc.judge(other)[1].category == "failing"


def test_the_base_image_of_a_multi_stage_dockerfile_is_its_last_stage(tmp_path: Path) -> None:
    """financial-document-processor (two stages, `COPY --from` uv's image): its line named no
    base image, so its Ubuntu pin on the Debian stand-in could not be told a stand-in limit."""
    from sandgym.tasks import load_task_dir

    d = tmp_path / "t"
    shutil.copytree(FIXTURES / "harbor-legacy", d)
    (d / "environment").mkdir(exist_ok=True)
    (d / "environment" / "Dockerfile").write_text(
        "FROM ubuntu:24.04 as build\nCOPY --from=ghcr.io/astral-sh/uv:0.8.14 /uv /bin/\n"
        "FROM --platform=linux/amd64 ubuntu:22.04 AS target\nWORKDIR /app\n"
    )
    assert hc._base_image(load_task_dir(d)) == "ubuntu:22.04"


def test_a_digest_pinned_base_runs_on_the_stand_in_of_its_tag() -> None:
    """parallel-particle-simulator (Terminal-Bench 1) pins `ubuntu-24-04:latest@sha256:...`,
    an exact build no registry here serves: it runs on that tag's stand-in, listed per task; a
    digest-pinned image without a stand-in is left as written (its build then says the image is
    unavailable)."""
    digest = "656c30e5b1e4f0526d5da9a157e69441a52b68314c1426f524fc3389ace9a3ae"
    text = (
        f"FROM ghcr.io/laude-institute/t-bench/ubuntu-24-04:latest@sha256:{digest}\n"
        "RUN apt-get update\n"
        f"FROM --platform=linux/amd64 example.org/other:1@sha256:{digest} AS x\n"
    )
    new, recs = sb.rewrite_script(text, is_dockerfile=True)
    assert new.splitlines() == [
        "FROM ghcr.io/laude-institute/t-bench/ubuntu-24-04:latest",
        "RUN apt-get update",
        f"FROM --platform=linux/amd64 example.org/other:1@sha256:{digest} AS x",
    ]
    assert recs == [
        {
            "name": "digest-pinned-base-to-stand-in",
            "original": f"FROM ghcr.io/laude-institute/t-bench/ubuntu-24-04:latest@sha256:{digest}",
        }
    ]
    assert "digest-pinned-base-to-stand-in" in sb.SUBSTITUTIONS
    # a script is not a Dockerfile: left alone
    assert sb.rewrite_script(text)[1] == []


def test_a_fetch_without_a_written_host_is_evidence_once_its_call_names_it(tmp_path: Path) -> None:
    """count-dataset-tokens loads a tokenizer and a dataset by repository id (no URL written)
    and fails on huggingface.co; chem-rf copies from `s3://kin-del-2024` and fails on
    kin-del-2024.s3.amazonaws.com: the solution fetches that host, so with the failing output
    naming it the task needs a host unreachable here. Without the call, the same output is
    no evidence."""
    from lab.bench.compat_outcome import decide

    task = tmp_path / "t"
    task.mkdir()
    (task / "solution.sh").write_text(
        'python - <<EOF\ntok = AutoTokenizer.from_pretrained("Qwen/Qwen2.5-1.5B-Instruct")\nEOF\n'
        "aws s3 cp s3://kin-del-2024/data/x.parquet x.parquet --no-sign-request\n"
    )
    refs = sb.referenced_unreachable_hosts(task)
    assert refs == {"solution.sh": ["huggingface.co", "kin-del-2024.s3.amazonaws.com"]}
    assert sb.implicit_hosts('load_dataset("local_dir")') == []  # no repository id
    for line in (
        "OSError: We couldn't connect to 'https://huggingface.co' to load the files",
        'fatal error: Could not connect to the endpoint URL: "https://kin-del-2024.s3.'
        'amazonaws.com/data/x.parquet"',
    ):
        entry = {
            "oracle_output": line,
            "oracle_network_lines": [line],
            "referenced_unreachable_hosts": refs,
            "base_image": "python:3.13-slim",
        }
        out = decide(entry, ["oracle_below_one"])
        assert out.category == "unreachable_host" and out.evidence is not None, out
        assert out.evidence.file == "solution.sh" and out.evidence.phase == "oracle"
        without = {**entry, "referenced_unreachable_hosts": {}}
        assert decide(without, ["oracle_below_one"]).category == "failing"


@pytest.mark.parametrize(
    ("line", "host"),
    [
        (
            "Resolving www.sqlite.org (www.sqlite.org)... failed: Name or service not known.",
            "www.sqlite.org",
        ),
        ("curl: (6) Could not resolve host: bootstrap.pypa.io", "bootstrap.pypa.io"),
        ("wget: unable to resolve host address ‘github.com’", "github.com"),
        ("Err:1 http://x Temporary failure resolving 'archive.ubuntu.com'", "archive.ubuntu.com"),
    ],
)
def test_a_tools_failed_lookup_names_its_host(line: str, host: str) -> None:
    """sqlite-with-gcov's solution runs `wget https://www.sqlite.org/...`; wget says only
    `Resolving www.sqlite.org (...)... failed`: that line names the host, so with the solution
    naming it too the task needs a host unreachable here (it was recorded failing)."""
    from lab.bench.compat_outcome import decide

    assert host in sb.unreachable_hosts(line)
    entry = {
        "oracle_network_lines": [line],
        "referenced_unreachable_hosts": {"solution.yaml": [host]},
        "base_image": "python:3.13-slim",
    }
    out = decide(entry, ["oracle_below_one"])
    assert out.category == "unreachable_host" and out.evidence is not None
    assert out.evidence.needs == host and out.evidence.file == "solution.yaml"


def test_pips_failed_connection_names_its_host_by_the_index_it_looks_in() -> None:
    """pytorch-model-cli (Terminal-Bench 1) runs `pip install torch==2.7.0 --index-url
    https://download.pytorch.org/whl/cpu`; pip's retry lines name only the path
    (`': /whl/cpu/torch/`), its `Looking in indexes:` line the host. Kept from the whole oracle
    output at run time, the two together are the evidence; either alone is none, and an index
    whose path the failed one does not extend is not the one that failed."""
    index = "Looking in indexes: https://download.pytorch.org/whl/cpu"
    retry = (
        "WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) "
        "after connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection."
        "HTTPSConnection object at 0x7f>: Failed to establish a new connection: [Errno -2] Name "
        "or service not known')': /whl/cpu/torch/"
    )
    kept = hc.network_failure_lines(f"{index}\nCollecting x\n{retry}\nERROR: No matching\n")
    assert kept == [index, retry]
    refs = {"solution.sh": ["download.pytorch.org"], "Dockerfile": ["ghcr.io"]}
    base = _entry(oracle_reward=0.0, referenced_unreachable_hosts=refs)
    _, out = hc.judge({**base, "oracle_network_lines": kept})
    assert out.category == "unreachable_host" and out.evidence is not None
    assert out.evidence.needs == "download.pytorch.org" and out.evidence.file == "solution.sh"
    assert index in out.evidence.output_line and "/whl/cpu/torch/" in out.evidence.output_line
    assert hc.judge({**base, "oracle_network_lines": [retry]})[1].category == "failing"
    assert hc.judge({**base, "oracle_network_lines": [index]})[1].category == "failing"
    other = "Looking in indexes: https://download.pytorch.org/whl/cu121"
    assert hc.judge({**base, "oracle_network_lines": [other, retry]})[1].category == "failing"
    # a host the failing phase's own files do not name is no evidence
    tests_only = {**base, "referenced_unreachable_hosts": {"run-tests.sh": refs["solution.sh"]}}
    assert hc.judge({**tests_only, "oracle_network_lines": kept})[1].category == "failing"


def test_setuptools_missing_under_pip_on_the_ubuntu_24_04_stand_in_is_its_limit() -> None:
    """chess-best-move (Terminal-Bench 1) runs `apt install python3-pip` then `pip3 install
    python-chess` on the Ubuntu 24.04 stand-in (Debian trixie): Debian's python3-pip does not
    bring python3-setuptools (Ubuntu 24.04's does), so chess's setup.py finds a namespace
    `setuptools` without `setup` (seen here). On the 22.04 stand-in (bookworm, whose pip still
    depends on setuptools) or a non-Ubuntu base the same line stays a failure."""
    line = "      AttributeError: module 'setuptools' has no attribute 'setup'"
    entry = _entry(
        base_image="ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624",
        oracle_reward=0.0,
        oracle_output=f"error: metadata-generation-failed\n{line}\n",
    )
    reasons, out = hc.judge(entry)
    assert reasons[0] == "stand_in_limit" and out.category == "stand_in_limit"
    assert out.evidence is not None and out.evidence.output_line == line.strip()
    assert "real Ubuntu 24.04" in out.action and "python3-setuptools" in out.action
    for base in ("ubuntu:22.04", "python:3.13-slim"):
        assert hc.judge({**entry, "base_image": base})[1].category == "failing"


def test_a_service_image_the_engine_lacks_leaves_the_denominator_with_its_name() -> None:
    """security-vulhub-minio's compose services run `vulhub/minio:...` from Docker Hub: the
    docker backend's SandboxCreateError carries the cause `image_missing`, recorded as
    `service_image_unavailable` (not `infra`, which a resumed run would re-run for ever), with
    the image and its registry as evidence. The same message with another cause is no evidence."""
    msg = (
        "service 'node1': image 'vulhub/minio:2023-02-27T18-10-45Z' is not present in the local "
        "Docker engine and no registry is used; build it"
    )

    def errs(cause: str) -> list[dict[str, Any]]:
        return [
            {"phase": p, "error_type": "SandboxCreateError", "message": msg, "cause": cause}
            for p in ("oracle", "noop")
        ]

    entry = _entry(oracle_reward=None, noop_reward=None, phase_errors=errs("image_missing"))
    reasons, out = hc.judge(entry)
    assert reasons == ["needs_unreachable_host", "service_image_unavailable"], reasons
    assert out.category == "unreachable_host" and out.evidence is not None
    assert out.evidence.needs.startswith("registry-1.docker.io (the image vulhub/minio:")
    assert out.evidence.file == "docker-compose.yaml"
    assert not hc.infra_only({"reasons": reasons})
    reasons, out = hc.judge({**entry, "phase_errors": errs("create")})
    assert reasons == ["infra"] and out.category == "failing"


def test_a_build_context_script_the_dockerfile_runs_gets_the_substitutions(tmp_path: Path) -> None:
    """Terminal-Bench 1's path-tracing-reverse copies install.sh into the image and runs it
    (`RUN bash /app/install.sh`); it fetches uv from astral.sh, so the build failed with `uv:
    command not found` (recorded `build_other`). The uv substitution reaches that script now,
    listed with its file; a script of the context no RUN line names stays as it is."""
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "tbench-modern", src)
    (src / "install.sh").write_text(TB1_SETUP_UV)
    (src / "data.sh").write_text(TB1_SETUP_UV)  # shipped, never run by the build
    with (src / "Dockerfile").open("a") as fh:
        fh.write("COPY install.sh /app\nRUN bash /app/install.sh\n")
    assert sb.dockerfile_run_scripts(src) == ["install.sh"]
    recs = sb.prepare_task_copy(src, tmp_path / "work" / "t")
    assert ("uv-installer-from-pypi", "install.sh") in [(r["name"], r["file"]) for r in recs]
    assert "data.sh" not in {r["file"] for r in recs}
    out = tmp_path / "work" / "t"
    assert "astral.sh" not in (out / "install.sh").read_text()
    assert (out / "data.sh").read_text() == TB1_SETUP_UV


def test_a_hub_call_given_a_variable_set_to_a_repository_id_fetches_huggingface() -> None:
    """hf-model-inference (Terminal-Bench 1) sets `model_name = 'distilbert-base-uncased-
    finetuned-sst-2-english'` (an older Hub id, no "org/") and calls
    `from_pretrained(model_name)`; its output says it could not connect to huggingface.co. A
    variable set to a path is no fetch."""
    from lab.bench.compat_outcome import decide

    script = (
        "model_name = 'distilbert-base-uncased-finetuned-sst-2-english'\n"
        "model = AutoModelForSequenceClassification.from_pretrained(model_name)\n"
    )
    assert sb.implicit_hosts(script) == ["huggingface.co"]
    local = "model_path = '/app/model_cache/m'\nm = A.from_pretrained(model_path)\n"
    assert sb.implicit_hosts(local) == []
    assert sb.implicit_hosts("m = A.from_pretrained(model_name)\n") == []  # never set here
    line = "OSError: We couldn't connect to 'https://huggingface.co' to load the files"
    refs = {"solution.sh": sb.implicit_hosts(script)}
    entry = {"oracle_network_lines": [line], "referenced_unreachable_hosts": refs}
    assert decide(entry, ["oracle_below_one"]).category == "unreachable_host"


def test_a_service_image_run_on_a_stand_in_is_listed_like_a_substitution(tmp_path: Path) -> None:
    from sandgym.tasks import load_task_dir

    task_dir = tmp_path / "sheets"
    shutil.copytree(FIXTURES / "tbench-modern", task_dir)
    compose = (task_dir / "docker-compose.yaml").read_text()
    (task_dir / "docker-compose.yaml").write_text(
        compose
        + "  db:\n    image: postgres:15\n"
        + "  s3:\n    image: vulhub/minio:2023-02-27\n"  # no stand-in: not listed
        + "  api:\n    build:\n      context: .\n"  # built by the task: not listed
    )
    records = hc.service_stand_in_records(load_task_dir(task_dir))
    assert records == [
        {
            "name": "service-image-stand-in",
            "original": "image: postgres:15",
            "file": "docker-compose.yaml",
            "service": "db",
            "stand_in": "sandgym/standin:postgres-15",
        }
    ]
    assert "service-image-stand-in" in sb.SUBSTITUTIONS
