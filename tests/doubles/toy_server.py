"""A toy inference server for the server-kind seam's test: the smallest HTTP server a kind can launch,
health-check and scrape. It is no real project's server and imitates none: it answers GET /health,
GET /v1/models (owned_by "toy") and GET /metrics with one counter, `toy:tokens_total`, that grows by
`--speed` per second of wall-clock time (prometheus_client writes the text)."""

from __future__ import annotations

import argparse
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Gauge, generate_latest


def main() -> None:
    parser = argparse.ArgumentParser(prog="toy_server.py", description="A toy server for gpudash's tests.")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind")
    parser.add_argument("--port", type=int, required=True, help="port to bind")
    parser.add_argument("--speed", type=float, default=10.0, help="tokens per second it counts")
    args = parser.parse_args()
    started = time.monotonic()
    registry = CollectorRegistry()
    tokens = Gauge("toy:tokens_total", "Tokens the toy has counted.", registry=registry)
    tokens.set_function(lambda: int((time.monotonic() - started) * args.speed))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, b'{"status": "ok"}', "application/json")
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"data": [{"id": "toy", "owned_by": "toy"}]}).encode(), "application/json")
            elif self.path == "/metrics":
                self._send(200, generate_latest(registry), "text/plain; version=0.0.4")
            else:
                self._send(404, b"not found", "text/plain")

        def _send(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
