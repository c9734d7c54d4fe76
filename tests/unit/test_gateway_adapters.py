"""The vllm-router / sglang-router adapter's pure parts: who should be in, what to change."""

from gateway.adapters.router_sync import desired_urls, plan_sync, sync_once
from gateway.statictable import static_table


def table():
    t = static_table("m", [
        {"url": "http://a:1/", "id": "a", "role": "both"},
        {"url": "http://b:1", "id": "b", "role": "decode"},
        {"url": "http://c:1", "id": "c", "role": "prefill"},
        {"url": "http://d:1", "id": "d", "role": "both", "state": "draining"},
    ])
    return t


def test_desired_urls_are_active_whole_request_workers():
    assert desired_urls(table()) == {"http://a:1", "http://b:1"}
    assert desired_urls(table(), "m") == {"http://a:1", "http://b:1"}


def test_plan_adds_before_removing_and_is_idempotent():
    assert plan_sync({"x", "y"}, {"y", "z"}) == (["x"], ["z"])
    assert plan_sync({"x"}, {"x"}) == ([], [])


class FakeRouter:
    def __init__(self, urls):
        self.workers = {u: f"id-{u}" for u in urls}
        self.calls = []

    def list(self):
        return dict(self.workers)

    def add(self, url):
        self.calls.append(("add", url))
        self.workers[url] = f"id-{url}"

    def remove(self, url, handle):
        self.calls.append(("remove", url, handle))
        del self.workers[url]


def test_sync_once_drives_the_router():
    router = FakeRouter(["http://a:1", "http://d:1"])
    assert sync_once(router, table()) == {"added": ["http://b:1"], "removed": ["http://d:1"]}
    assert router.calls == [("add", "http://b:1"), ("remove", "http://d:1", "id-http://d:1")]
    assert sync_once(router, table()) == {"added": [], "removed": []}
