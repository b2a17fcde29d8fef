"""The push worker's counterpart in its tests: an HTTP server (standard library only) that
answers each pushed task as its taskData's "do" says, checks every Standard Webhooks signature
with Python's own hmac (an implementation independent of the worker's), and writes what it saw
to an events file, a line each: "signed <task id> ok|bad|none", "closed <task id>" when the
worker hung up on a request it was still answering, "answered <task id>" when it did not hang
up within 25 s and was answered.

Usage: push_server.py PORT EVENTS_FILE  (the secret, if any, in PUSH_SECRET)
"""

import base64
import email.utils
import hashlib
import hmac
import json
import os
import select
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, EVENTS = int(sys.argv[1]), sys.argv[2]
SECRET = os.environ.get("PUSH_SECRET")


def record(line):
    with open(EVENTS, "a") as events:
        events.write(line + "\n")


def signature_ok(headers, body):
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    fresh = abs(time.time() - int(headers["webhook-timestamp"])) < 300
    offered = [s.removeprefix("v1,") for s in headers["webhook-signature"].split()]
    return fresh and any(hmac.compare_digest(expected, s) for s in offered)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body=b"", headers=()):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        task = json.loads(body)
        task_id = self.headers["Leasehold-Task-Id"]
        if SECRET:
            ok = signature_ok(self.headers, body)
            record(f"signed {task_id} {'ok' if ok else 'bad'}")
            if not ok:
                return self.answer(401, b"bad signature")
        else:
            record(f"signed {task_id} none")
        do = task["taskData"].get("do")
        if do == "json":
            seen = {
                "id": task["id"],
                "taskId": task_id,
                "attempt": self.headers["Leasehold-Attempt"],
                "deadline": bool(self.headers.get("Leasehold-Deadline")),
                "traceparent": self.headers.get("traceparent"),
            }
            self.answer(200, json.dumps(seen).encode(), [("Content-Type", "application/json")])
        elif do == "text":
            self.answer(200, b"plain text", [("Content-Type", "text/plain")])
        elif do == "later":
            self.answer(429, b"slow down", [("Retry-After", "30")])
        elif do == "later-date":
            now = time.time()
            self.answer(503, b"", [
                ("Date", email.utils.formatdate(now, usegmt=True)),
                ("Retry-After", email.utils.formatdate(now + 45, usegmt=True)),
            ])
        elif do == "busy":
            self.answer(503, b"busy")
        elif do == "bad":
            self.answer(422, b"the input was wrong")
        elif do == "broken":
            self.answer(500, b"it broke")
        elif do == "hang":
            # Answer nothing for 25 s, and see the worker hang up; one that did not gets 200.
            deadline = time.time() + 25
            while time.time() < deadline:
                readable, _, _ = select.select([self.connection], [], [], 0.1)
                if readable and not self.connection.recv(1, socket.MSG_PEEK):
                    record(f"closed {task_id}")
                    self.close_connection = True
                    return
            record(f"answered {task_id}")
            self.answer(200, b'{"late": true}', [("Content-Type", "application/json")])
        else:
            self.answer(400, b"no such do")


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
