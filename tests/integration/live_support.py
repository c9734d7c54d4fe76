"""Shared by the tests that drive the live dashboard consumer with a WebsocketCommunicator."""

# How long such a test waits for a message it expects. An upper bound, not a speed goal: on a
# 2-core CI box, beside the shard that runs two vLLM engines and Chromium, one routing-page
# update took more than 10 s to arrive (quiet, the same test takes 2 s in all).
WAIT_S = 30
