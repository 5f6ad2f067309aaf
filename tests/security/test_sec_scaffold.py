"""The red-team suite's own support works: a throwaway user is real and unprivileged."""

from __future__ import annotations

import os
import subprocess

from secsupport import as_user, needs_root, throwaway_user


@needs_root
def test_throwaway_user_is_real_and_unprivileged() -> None:
    with throwaway_user() as user:
        out = subprocess.run(["id", "-u"], capture_output=True, text=True, check=True, **as_user(user))  # type: ignore[call-overload]
        assert int(out.stdout) == user.pw_uid != 0
        assert os.path.isdir(user.pw_dir)
        denied = subprocess.run(["cat", "/etc/shadow"], capture_output=True, **as_user(user))  # type: ignore[call-overload]
        assert denied.returncode != 0
    assert not os.path.exists(user.pw_dir)
