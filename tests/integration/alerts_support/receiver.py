"""A webhook receiver for the alert tests: a real process on loopback.

Verifies every request with the ``standardwebhooks`` library and appends one JSON line
per request to ``--log``: webhook-id, whether the signature verified, the HTTP status it
answered and the body. Behaviour is read from ``--control`` (JSON) on every request:
``{"status": 200, "delay_s": 0, "retry_after": null, "fail_first": 0}`` — ``fail_first``
answers 503 to the first N requests of each webhook-id.

Usage: python receiver.py --port P --secret whsec_... --log FILE --control FILE
"""

import argparse
import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--secret", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--control", required=True)
    args = ap.parse_args()
    verifier = Webhook(args.secret)
    seen = Counter()
    lock = threading.Lock()

    def control():
        try:
            with open(args.control) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return {}

    def record(entry):
        with lock, open(args.log, "a") as fh:
            fh.write(json.dumps(entry) + "\n")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                verifier.verify(body, headers)
                verified, error = True, ""
            except Exception as exc:  # the library raises several types
                verified, error = False, f"{type(exc).__name__}: {exc}"
            ctl = control()
            wid = headers.get("webhook-id", "")
            with lock:
                seen[wid] += 1
                nth = seen[wid]
            status = int(ctl.get("status", 200))
            if nth <= int(ctl.get("fail_first", 0)):
                status = 503
            if not verified:
                status = 401
            try:
                payload = json.loads(body)
            except ValueError:
                payload = None
            record(
                {
                    "id": wid,
                    "verified": verified,
                    "error": error,
                    "status": status,
                    "phase": "received",
                    "at": time.time(),
                    "body": payload,
                    "signature": headers.get("webhook-signature", ""),
                }
            )
            time.sleep(float(ctl.get("delay_s", 0)))
            record({"id": wid, "phase": "answered", "status": status, "at": time.time()})
            self.send_response(status)
            if ctl.get("retry_after") is not None:
                self.send_header("Retry-After", str(ctl["retry_after"]))
            self.send_header("content-type", "text/plain")
            self.end_headers()
            self.wfile.write(b"ok" if status < 300 else b"nope")

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
