"""The private verifier's payload and report (sandgym/tasks/private_verify.py), without a sandbox."""

from __future__ import annotations

import base64
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from sandgym.tasks.errors import VerifierError
from sandgym.tasks.private_verify import WRAPPER, build_payload, parse_report


def _members(payload: bytes, nonce: str) -> dict[str, bytes]:
    head, _, body = payload.partition(b"\n")
    assert head == nonce.encode()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_payload_carries_tests_and_secrets_but_no_escaping_symlinks(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    (tests / "sub").mkdir(parents=True)
    (tests / "test.sh").write_text("echo hi\n")
    (tests / "sub" / "data.txt").write_text("d")
    (tests / "inside").symlink_to("test.sh")
    outside = tmp_path / "host-secret"
    outside.write_text("HOST")
    (tests / "escape").symlink_to(outside)
    members = _members(build_payload("n1", tests, {"secret/answer": (b"42", 0o600)}), "n1")
    assert members["test.sh"] == b"echo hi\n"
    assert members["sub/data.txt"] == b"d"
    assert members["inside"] == b"echo hi\n"  # followed: it stays inside the tests
    assert members["secret/answer"] == b"42"
    assert "escape" not in members


def test_report_is_parsed_from_the_last_block_with_its_nonce() -> None:
    b64 = base64.b64encode(b"1\n").decode()
    forged = f"other begin\nreward.txt {base64.b64encode(b'9').decode()}\nother end 0\n"
    stderr = f"noise\n{forged}\nN begin\nreward.txt {b64}\nN end 3\ntrailing junk\n"
    rep = parse_report(stderr, "N", "out")
    assert rep.exit_code == 3
    assert rep.files == {"reward.txt": "1\n"}


@pytest.mark.parametrize(
    "stderr",
    ["", "N begin\nreward.txt AAA\n", "N begin\nevil.txt QQ==\nN end 0\n", "N begin\nN end x\n"],
)
def test_a_missing_or_malformed_report_is_a_verifier_error(stderr: str) -> None:
    with pytest.raises(VerifierError):
        parse_report(stderr, "N", "out")


def test_wrapper_script_is_valid_sh() -> None:
    subprocess.run(["sh", "-n", "-c", WRAPPER], check=True)
