"""What the gateway makes of headers on both sides (request headers by lower-case name, the
first of a repeated name in any case winning; a worker's repeated header passed on with its
last value), and the in-flight gauge read from the load table at scrape time (issue 19)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from gateway import front, upstream_http
from gateway.app import Gateway
from gateway.config import GatewayConfig
from gateway.load import WorkerLoad
from gateway.metrics import GatewayMetrics
from gateway.proxy import OpenUpstream

_TOKEN = st.text("abcXYZ-_0129!#$%&'*+.^`|~", min_size=1, max_size=8)
_VALUE = st.binary(max_size=12).map(
    lambda b: bytes(c for c in b if c == 9 or 32 <= c < 127 or c >= 128).strip(b" \t"))


class _Transport:
    def get_extra_info(self, name, default=None):
        return None

    def close(self):
        pass


def _oracle(pairs: list[tuple[str, bytes]]) -> dict[str, str]:
    """The per-header code before: lower-cased name, latin-1 value, the first wins."""
    out: dict[str, str] = {}
    for name, value in pairs:
        out.setdefault(name.lower(), value.decode("latin-1"))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_TOKEN, _VALUE), max_size=8),
       st.lists(st.sampled_from([0, 1, 2]), max_size=8))
def test_request_headers_as_the_per_header_code_made_them(pairs, recase):
    # Repeat some names in another case, to check which of them wins.
    pairs = pairs + [(pairs[i][0].upper() if k == 1 else pairs[i][0].title(), b"later")
                     for i, k in enumerate(recase[:len(pairs)]) if k]
    pairs = [(n, v) for n, v in pairs if n.lower() not in ("content-length",
                                                         "transfer-encoding", "upgrade")]
    conn = front._Conn(front.Front(Gateway(GatewayConfig(kv_events=False, seed=1))))
    conn.transport = _Transport()
    conn._kick = lambda: None
    head = b"".join(b"%s: %s\r\n" % (n.encode(), v) for n, v in pairs)
    for _ in range(2):  # twice on one connection: nothing of the first is left over
        conn.data_received(b"POST /v1/completions HTTP/1.1\r\n" + head
                           + b"Content-Length: 2\r\n\r\n{}")
        req = conn.queue.pop()
        expected = _oracle([*pairs, ("content-length", b"2")])
        assert dict(req.headers) == expected
        assert req.headers.get("CONTENT-LENGTH") == "2" and req.complete


def test_worker_headers_reach_the_client_as_before():
    """A repeated name keeps its first place and last value, hop-by-hop headers are dropped,
    non-ASCII bytes survive; the connection is reused for the next answer."""
    pool = upstream_http.UpstreamPool()
    conn = upstream_http._Connection(pool, ("h", 1, False))
    conn.transport = _Transport()
    for _ in range(2):
        response = upstream_http.UpstreamResponse(conn)
        conn.response = response
        conn.data_received(b"HTTP/1.1 200 OK\r\nX-A: 1\r\nContent-Type: application/json\r\n"
                           b"X-A: 2\r\nX-B: \xe9t\xe9\r\nServer: w\r\nContent-Length: 2\r\n\r\nok")
        assert response.complete and response.status == 200
        assert response.headers.get("x-b") == "\xe9t\xe9"
        opened = OpenUpstream(response, b"ok", "w")
        assert opened.client_headers() == {"X-A": "2", "Content-Type": "application/json",
                                           "X-B": "\xe9t\xe9"}
        assert not response._until_close()
        conn.response = None


def test_in_flight_gauge_is_read_from_the_loads_when_scraped():
    metrics = GatewayMetrics()
    loads = {"a": WorkerLoad(in_flight=3), "b": WorkerLoad()}
    metrics.watch_loads(loads)
    text = generate_latest(metrics.registry).decode()
    assert 'pdplane_gateway_worker_in_flight{worker="a"} 3.0' in text
    assert 'pdplane_gateway_worker_in_flight{worker="b"} 0.0' in text
    loads["a"].in_flight = 0
    assert 'pdplane_gateway_worker_in_flight{worker="a"} 0.0' in generate_latest(
        metrics.registry).decode()
