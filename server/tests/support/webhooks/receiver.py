#!/usr/bin/env python3
"""A webhook receiver for Tessera's tests, verifying every delivery with the `standardwebhooks` package (PyPI), an
implementation of the Standard Webhooks specification not written in this repository.

It listens on 127.0.0.1 (`--port`, or an ephemeral port; printed first as `{"listening": <port>}`), reads signing secrets from its
standard input (`add <secret>` adds one, `only <secret>` keeps just that one) and prints one JSON line per request:
`{"verified": true, "id": ..., "type": ..., "subject": ..., "tenant": ..., "status": ...}`, or `"verified": false` with
the error. Until it knows a secret it answers 503; with `--fail-for S` it answers 500 to every delivery for the first S
seconds after it learns one; a delivery that does not verify gets 401; otherwise 204. `--slack` accepts unsigned
`{"text": ...}` bodies and prints them.
"""

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook

lock = threading.Lock()
secrets = []
ready_at = None
args = None


def emit(record):
    record["at"] = time.time()
    with lock:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *_):
        pass

    def answer(self, status):
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()
        return status

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        headers = {k.lower(): v for k, v in self.headers.items()}
        if args.slack:
            emit({"verified": True, "text": json.loads(body).get("text"), "content_type": headers.get("content-type"),
                  "status": self.answer(204)})
            return
        with lock:
            known = list(secrets)
            since = ready_at
        if not known:
            emit({"verified": False, "error": "no secret yet", "id": headers.get("webhook-id"), "status": self.answer(503)})
            return
        if args.fail_for and time.monotonic() - since < args.fail_for:
            emit({"verified": False, "error": "failing on purpose", "id": headers.get("webhook-id"),
                  "status": self.answer(500)})
            return
        errors = []
        for secret in known:
            try:
                event = Webhook(secret).verify(body, headers)
            except Exception as e:  # noqa: BLE001 - any failure to verify is reported
                errors.append(str(e))
                continue
            emit({"verified": True, "id": headers.get("webhook-id"), "type": event.get("type"),
                  "subject": event.get("subject"), "tenant": event.get("tenant"), "ce_id": event.get("id"),
                  "specversion": event.get("specversion"), "content_type": headers.get("content-type"),
                  "signatures": len(headers.get("webhook-signature", "").split(" ")), "status": self.answer(204)})
            return
        emit({"verified": False, "error": "; ".join(errors), "id": headers.get("webhook-id"), "status": self.answer(401)})


def read_secrets():
    global ready_at
    for line in sys.stdin:
        parts = line.split()
        if len(parts) != 2:
            continue
        with lock:
            if parts[0] == "only":
                secrets.clear()
            secrets.append(parts[1])
            if ready_at is None:
                ready_at = time.monotonic()


def main():
    global args
    p = argparse.ArgumentParser()
    p.add_argument("--fail-for", type=float, default=0)
    p.add_argument("--slack", action="store_true")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    emit({"listening": server.server_address[1]})
    threading.Thread(target=read_secrets, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
