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


def test_a_gateway_holds_what_its_open_file_limit_leaves():
    assert limits.connection_budget(20_000, 32_768) == 20_000 - limits.RESERVED_FILES
    assert limits.connection_budget(65_536, 16_384) == 16_384  # the configured cap, when lower
    assert limits.connection_budget(1024, 16_384) == 512  # a small limit: half of it
