"""Agent configuration loading and command hooks."""

import asyncio
import http.server
import json
import sys
import threading

import pytest

from workers_agent.collectors.gpu import NvmlGpuCollector
from workers_agent.commands import CommandRunner, Refused, check_args
from workers_agent.config import ConfigError, load

BASE_ENV = {"PDPLANE_AGENT_TOKEN": "t"}


def test_toml_then_env_then_flags(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text('server = "ws://a/ws/agent/v1/"\nhostname = "from-file"\n'
                    'report_interval_s = 5\n[[engines]]\nid = "e0"\nmodel = "m"\n'
                    '[hooks.drain]\nshell = "true {engine}"\n')
    cfg = load(str(path), {**BASE_ENV, "PDPLANE_AGENT_HOSTNAME": "from-env"},
               {"report_interval_s": 1.5})
    assert (cfg.server, cfg.hostname, cfg.report_interval_s) == (
        "ws://a/ws/agent/v1/", "from-env", 1.5)
    assert cfg.engines[0]["id"] == "e0" and cfg.hooks["drain"]["shell"]


def test_json_config_and_token_file(tmp_path):
    token = tmp_path / "token"
    token.write_text("secret\n")
    path = tmp_path / "agent.json"
    path.write_text(json.dumps({"server": "wss://x/ws/agent/v1/", "token_file": str(token)}))
    assert load(str(path), {}).resolve_token() == "secret"


@pytest.mark.parametrize("content, message", [
    ('server = "ws://a/"\ntypo_key = 1\n', "unknown keys"),
    ('server = "http://a/"\n', "ws://"),
    ('server = "ws://a/"\n[[engines]]\nid = "e0"\n', "model"),
    ('server = "ws://a/"\n[hooks.drain]\nshell = "x"\nhttp = {url = "http://x"}\n',
     "exactly one"),
    ('server = "ws://a/\n', "agent.toml"),
])
def test_bad_configs_are_refused_with_a_reason(tmp_path, content, message):
    path = tmp_path / "agent.toml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load(str(path), BASE_ENV)


def test_missing_token_is_an_error():
    with pytest.raises(ConfigError, match="token"):
        load(None, {"PDPLANE_AGENT_SERVER": "ws://a/ws/agent/v1/"})


def test_check_args_refuses_what_does_not_fit():
    engines = {"e0"}
    assert check_args("set_role", {"engine": "e0", "role": "decode"}, engines)["role"] == "decode"
    for command, args in (("format", {"engine": "e0"}), ("drain", {}),
                          ("drain", {"engine": "e9"}), ("set_role", {"engine": "e0"}),
                          ("set_role", {"engine": "e0", "role": "boss"}),
                          ("drain", {"engine": "e0", "x": "a; rm -rf /"}),
                          ("drain", {"engine": "e0", "x": {"nested": 1}})):
        with pytest.raises(Refused):
            check_args(command, args, engines)


def test_shell_hook_runs_without_a_shell(tmp_path):
    out = tmp_path / "out"
    script = (f"{sys.executable} -c \"import sys; open('{out}', 'w').write(' '.join(sys.argv[1:]))"
              "\" {engine} {role}")
    runner = CommandRunner({"set_role": {"shell": script}}, {"e0"})
    status, _detail, values = asyncio.run(runner.run("set_role",
                                                     {"engine": "e0", "role": "prefill"}))
    assert status == "succeeded" and out.read_text() == "e0 prefill"
    assert values["role"] == "prefill"


def test_failed_and_unconfigured_hooks():
    runner = CommandRunner({"drain": {"shell": "false"}}, {"e0"})
    assert asyncio.run(runner.run("drain", {"engine": "e0"}))[0] == "failed"
    status, detail, _ = asyncio.run(runner.run("resume", {"engine": "e0"}))
    assert status == "refused" and "no hook" in detail


def test_http_hook_posts_json():
    received = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            received["path"] = self.path
            received["body"] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"ok": true}')

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/engines/{{engine}}/role"
        runner = CommandRunner({"set_role": {"http": {"url": url, "json": {"role": "{role}"}}}},
                               {"e0"})
        status, detail, _ = asyncio.run(runner.run("set_role",
                                                   {"engine": "e0", "role": "decode"}))
        assert status == "succeeded" and '"ok"' in detail
        assert received == {"path": "/engines/e0/role", "body": {"role": "decode"}}
    finally:
        server.shutdown()


def test_nvml_degrades_cleanly_without_a_driver():
    gpus = NvmlGpuCollector()
    if gpus.available:
        pytest.skip("an NVIDIA driver is present")
    assert gpus.inventory() == [] and gpus.sample() == [] and "NVML" in gpus.reason
