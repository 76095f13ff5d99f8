"""`sandgym.sandboxes.common.users.is_root_user`: the one test of "runs as root" that the backends (whether to
switch user) and the verifier (whether its tests may see the agent's processes) share."""

from __future__ import annotations

import pytest

from sandgym.sandboxes.common.users import is_root_user


@pytest.mark.parametrize("user", [None, "", "root", "0"])
def test_root_by_default_name_or_uid(user: str | None) -> None:
    assert is_root_user(user)


@pytest.mark.parametrize("user", ["nobody", "1000", "agent", "rootless", "00"])
def test_any_other_user_is_not_root(user: str) -> None:
    assert not is_root_user(user)
