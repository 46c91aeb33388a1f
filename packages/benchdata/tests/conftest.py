import socket

import pytest


def refuse_network(patch: pytest.MonkeyPatch) -> None:
    """Make any attempt to open a network connection fail the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    patch.setattr(socket.socket, "connect", refuse)
    patch.setattr(socket, "create_connection", refuse)
    patch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture
def no_network(monkeypatch):
    refuse_network(monkeypatch)


@pytest.fixture
def empty_dir(tmp_path):
    """A location that exists but holds no data."""
    folder = tmp_path / "empty"
    folder.mkdir()
    return folder
