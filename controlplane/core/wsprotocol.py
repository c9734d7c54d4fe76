"""uvicorn's websocket protocol, with a fast refusal of oversized upgrade requests.

websockets refuses a request line or header over 8 KB (``HeaderLineTooLong``, also more
than 128 headers) by queueing a 431/414 answer, but uvicorn 0.54's sans-I/O protocol never
sends what is queued after a failed handshake, nor closes: an agent or browser with a huge
``Authorization`` header hung for minutes (issue 20, defect 10). This subclass sends the
answer and closes at once. Select it with
``uvicorn --ws controlplane.core.wsprotocol:WebSocketProtocol`` (the launcher, Docker and the
benchmarks do).
"""

from __future__ import annotations

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol


class WebSocketProtocol(WebSocketsSansIOProtocol):
    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if (
            not self.handshake_initiated
            and self.conn.handshake_exc is not None
            and not self.transport.is_closing()
        ):
            self.transport.write(b"".join(self.conn.data_to_send()))
            self.transport.close()


# The value for ``uvicorn --ws``.
UVICORN_WS = f"{__name__}:{WebSocketProtocol.__name__}"
