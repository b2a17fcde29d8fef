#!/usr/bin/env python3
"""A Leasehold push endpoint in Python (standard library only): the bundled worker, run beside
this application, POSTs each task it claims here.

    PUSH_SECRET=whsec_... python3 examples/push/app.py 8000
    WORKER_PUSH_URL=http://127.0.0.1:8000/tasks WORKER_PUSH_SECRET=whsec_... worker

The body is the task as JSON; the answer is the outcome: 2xx succeeded (the body its output),
429 or 503 with Retry-After snoozed, another 4xx failed for good, 5xx failed and retried. Each
request carries a Standard Webhooks signature, checked here so that only the worker is heard.
"""

import base64
import hashlib
import hmac
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KEY = base64.b64decode(os.environ["PUSH_SECRET"].removeprefix("whsec_"))


def signed_by_the_worker(headers, body):
    """Standard Webhooks: v1, the base64 HMAC-SHA256 of "{id}.{timestamp}.{body}"."""
    msg_id, timestamp = headers.get("webhook-id", ""), headers.get("webhook-timestamp", "")
    if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > 300:
        return False  # unsigned, or too old to be this delivery
    message = f"{msg_id}.{timestamp}.".encode() + body
    expected = "v1," + base64.b64encode(hmac.new(KEY, message, hashlib.sha256).digest()).decode()
    offered = headers.get("webhook-signature", "").split()
    return any(hmac.compare_digest(expected.encode(), s.encode()) for s in offered)


class Tasks(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the worker reuses its connections

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if not signed_by_the_worker(self.headers, body):
            return self.answer(401, {"error": "not signed by our worker"})
        n = json.loads(body)["taskData"].get("n")
        if not isinstance(n, (int, float)):
            return self.answer(422, {"error": f"taskData.n must be a number, not {n!r}"})
        self.answer(200, {"square": n * n})

    def answer(self, status, value):
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Tasks).serve_forever()
