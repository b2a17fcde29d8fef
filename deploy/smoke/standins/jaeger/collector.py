"""Stand-in for Jaeger's all-in-one, for the smoke test only.

Receives OTLP/HTTP traces on :4318 (protobuf, as the services send them, or JSON), counts the
spans of each `service.name`, and answers Jaeger's query API's service list on :16686
(GET /api/services) with the services that sent at least one span, and each service's span
names (GET /api/services/NAME/operations); GET /api/spans gives the counts. It decodes only the few protobuf fields it needs, so it needs nothing but Python.
"""

import gzip
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
spans = {}
operations = {}
lock = threading.Lock()


def fields(buf):
    """Yields (field number, wire type, value) of one protobuf message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            size, i = varint(buf, i)
            value, i = buf[i:i + size], i + size
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value


def varint(buf, i):
    shift = result = 0
    while True:
        byte = buf[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, i
        shift += 7


def service_of_resource(resource):
    # Resource.attributes (1) -> KeyValue{key (1), value (2) -> AnyValue{string_value (1)}}
    for number, _, attribute in fields(resource):
        if number != 1:
            continue
        key = value = None
        for n, _, v in fields(attribute):
            if n == 1:
                key = v.decode()
            elif n == 2:
                value = next((s.decode() for m, _, s in fields(v) if m == 1), None)
        if key == "service.name":
            return value
    return None


def count_protobuf(body):
    """The spans of each service, and the names they bear."""
    counted, names = {}, {}
    # ExportTraceServiceRequest.resource_spans (1) -> ResourceSpans{resource (1), scope_spans (2)}
    for number, _, resource_spans in fields(body):
        if number != 1:
            continue
        service, seen = "unknown_service", []
        for m, _, v in fields(resource_spans):
            if m == 1:
                service = service_of_resource(v) or service
            elif m == 2:  # ScopeSpans.spans (2) -> Span{name (5)}
                seen += [next((n.decode() for f, _, n in fields(span) if f == 5), "")
                         for k, _, span in fields(v) if k == 2]
        counted[service] = counted.get(service, 0) + len(seen)
        names.setdefault(service, set()).update(seen)
    return counted, names


def count_json(body):
    counted, names = {}, {}
    for resource_spans in json.loads(body).get("resourceSpans", []):
        attributes = resource_spans.get("resource", {}).get("attributes", [])
        service = next((a["value"].get("stringValue") for a in attributes
                        if a.get("key") == "service.name"), None) or "unknown_service"
        seen = [span.get("name", "") for s in resource_spans.get("scopeSpans", [])
                for span in s.get("spans", [])]
        counted[service] = counted.get(service, 0) + len(seen)
        names.setdefault(service, set()).update(seen)
    return counted, names


class Handler(BaseHTTPRequestHandler):
    def reply(self, status, body, content_type):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        is_json = "json" in (self.headers.get("Content-Type") or "")
        try:
            counted, names = count_json(body) if is_json else count_protobuf(body)
        except (ValueError, IndexError, KeyError, UnicodeDecodeError) as err:
            self.reply(400, str(err).encode(), "text/plain")
            return
        with lock:
            for service, n in counted.items():
                spans[service] = spans.get(service, 0) + n
            for service, seen in names.items():
                operations.setdefault(service, set()).update(seen)
        # An empty ExportTraceServiceResponse.
        self.reply(200, b"{}" if is_json else b"", "application/json" if is_json
                   else "application/x-protobuf")

    def do_GET(self):
        with lock:
            services = sorted(s for s, n in spans.items() if n > 0)
            counts = dict(spans)
            named = {service: sorted(seen) for service, seen in operations.items()}
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) == 4 and parts[:2] == ["api", "services"] and parts[3] == "operations":
            body = {"data": named.get(parts[2], []), "total": len(named.get(parts[2], []))}
        elif self.path.startswith("/api/services"):
            body = {"data": services, "total": len(services)}
        elif self.path.startswith("/api/spans"):
            body = counts
        else:
            self.reply(404, b"", "text/plain")
            return
        self.reply(200, json.dumps(body).encode(), "application/json")

    def log_message(self, *_):
        pass


for port in (4318, 16686):
    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
threading.Event().wait()
