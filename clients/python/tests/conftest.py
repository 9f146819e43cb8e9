"""Fixtures: a real ``idalloc serve`` on a real etcd.

IDALLOC_BIN is the idalloc binary, IDALLOC_TEST_ETCD the etcd endpoint. Without them the tests
are skipped, except under CI (CI set), where a missing one fails.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import threading
from typing import Callable, Iterator, List

import pytest


class Serve:
    """One ``idalloc serve`` process on a free loopback port."""

    def __init__(self, bin: str, etcd: str, prefix: str, args: List[str]) -> None:
        cmd = [bin, "--store", etcd, "--prefix", prefix, "--timeout", "3s", "serve",
               "--listen", "127.0.0.1:0", "--sweep-interval", "1s", *args]
        env = dict(os.environ, RUST_LOG="warn,idalloc::audit=off")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
        line: List[bytes] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(60)
        first = line[0].decode().strip() if line else ""
        if not first.startswith("listening on "):
            self.kill()
            raise RuntimeError(f"serve did not start: first line {first!r}")
        self.addr = first[len("listening on "):]
        # Drain stdout so the process never blocks on it.
        threading.Thread(target=lambda: self.proc.stdout.read(), daemon=True).start()

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://{self.addr}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def start_serve(request: pytest.FixtureRequest) -> Iterator[Callable[..., Serve]]:
    """``start_serve(prefix=None, *args)`` starts a serve; every one is killed after the test."""
    bin, etcd = os.environ.get("IDALLOC_BIN"), os.environ.get("IDALLOC_TEST_ETCD")
    if not bin or not etcd:
        if os.environ.get("CI"):
            pytest.fail(f"IDALLOC_BIN ({bin!r}) and IDALLOC_TEST_ETCD ({etcd!r}) are required under CI")
        pytest.skip("IDALLOC_BIN and IDALLOC_TEST_ETCD not set")
    started: List[Serve] = []

    def start(prefix: "str | None" = None, *args: str) -> Serve:
        s = Serve(bin, etcd, prefix or unique_prefix(request), list(args))
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()


def unique_prefix(request: pytest.FixtureRequest) -> str:
    return f"py-test-{request.node.name.replace('[', '-').replace(']', '')}-{secrets.token_hex(4)}"


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> str:
    return unique_prefix(request)
