"""Nothing the harness starts listens on a non-loopback address, and Gloo/NCCL are pinned to
the loopback interface unless the user chose an interface."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import harness_rankfns as fns
import pytest
from harness_testutil import BACKEND, descendants, is_loopback, listening_addresses

import harness

_IFF_LOOPBACK = 0x8


def _loopback_names() -> set[str]:
    """Names of the loopback interfaces, read from sysfs (independently of the harness)."""
    names = set()
    for name in os.listdir("/sys/class/net"):
        try:
            with open(f"/sys/class/net/{name}/flags") as handle:
                flags = int(handle.read().strip(), 16)
        except (OSError, ValueError):
            continue
        if flags & _IFF_LOOPBACK:
            names.add(name)
    return names


@pytest.fixture(scope="module")
def world3() -> Iterator[harness.World]:
    """Created in this module (after the IFNAME variables are known to be unset or set)."""
    with harness.World(3, backend=BACKEND, timeout=60) as world:
        yield world


def test_detector_sees_a_socket_listening_on_all_interfaces() -> None:
    # The check below is only worth something if it would catch a wildcard listener.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        port = sock.getsockname()[1]
        found = listening_addresses()
        assert ("0.0.0.0", port) in found
        assert not is_loopback("0.0.0.0")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert ("127.0.0.1", sock.getsockname()[1]) in listening_addresses()
    if socket.has_ipv6:
        try:
            sock6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            sock6.bind(("::1", 0))
        except OSError:
            return  # no IPv6 loopback in this container
        with sock6:
            sock6.listen()
            assert ("::1", sock6.getsockname()[1]) in listening_addresses()
    assert is_loopback("::1")
    assert is_loopback("::ffff:127.0.0.1")


def test_ranks_listen_on_loopback_only(world3: harness.World) -> None:
    loopbacks = _loopback_names()
    assert loopbacks, "no loopback interface found in /sys/class/net"
    results = world3.run(fns.rank_network)
    for rank, result in enumerate(results):
        if "GLOO_SOCKET_IFNAME" not in os.environ:
            assert result["GLOO_SOCKET_IFNAME"] in loopbacks
        if "NCCL_SOCKET_IFNAME" not in os.environ:
            assert result["NCCL_SOCKET_IFNAME"] in loopbacks
        # Gloo's listener proves the check inspects real sockets.
        assert result["listening"], f"rank {rank} has no listening socket at all"
        for ip, port in result["listening"]:
            assert is_loopback(ip), f"rank {rank} listens on {ip}:{port}"


def test_controller_and_everything_it_started_listen_on_loopback_only(
    world3: harness.World,
) -> None:
    assert world3.run(fns.all_reduce_sum) == [6.0] * 3
    pids = {os.getpid()} | descendants(os.getpid())
    assert set(world3.pids) <= pids
    for pid in sorted(pids):
        for ip, port in listening_addresses(pid):
            assert is_loopback(ip), f"process {pid} listens on {ip}:{port}"


def test_master_port_is_free_on_loopback(world3: harness.World) -> None:
    # MASTER_PORT is for user code that reads it; nothing of ours may hold it open.
    port = int(world3.run(fns.torchrun_env)[0]["MASTER_PORT"] or 0)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))


def test_user_chosen_interface_is_passed_on(monkeypatch: pytest.MonkeyPatch) -> None:
    # Set after the forkserver started (earlier tests of this module): it must still arrive.
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "^docker0,veth")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    [result] = harness.run(fns.rank_network, world_size=1, backend=BACKEND, timeout=60)
    assert result["NCCL_SOCKET_IFNAME"] == "^docker0,veth"
    assert result["GLOO_SOCKET_IFNAME"] in _loopback_names()
    assert all(is_loopback(ip) for ip, _ in result["listening"])
