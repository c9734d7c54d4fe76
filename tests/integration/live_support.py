"""Shared by the tests that drive the live dashboard consumer with a WebsocketCommunicator."""

# How long such a test waits for a message it expects: the suite's one bound (tests/conftest.py).
from tests.conftest import WAIT_S

__all__ = ["WAIT_S"]
