"""The open-file limit a server process asks for at start."""

from __future__ import annotations

import resource

from actors.host import limits


def test_the_target_is_the_wanted_limit_capped_by_the_kernel():
    assert limits.target(65536, 1024, 4096, 1048576) == (65536, 65536)
    assert limits.target(65536, 1024, 4096, 32768) == (32768, 32768)
    assert limits.target(65536, 1024, 4096, None) == (65536, 65536)


def test_a_higher_limit_set_by_the_deployment_is_kept():
    assert limits.target(65536, 100_000, 200_000, 1048576) == (100_000, 200_000)


def test_raising_never_lowers_the_soft_limit():
    before = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert limits.raise_open_files(16) >= before
