"""A real SMTP server for the notification tests: aiosmtpd (PyPI), not written here.

Prints `{"listening": PORT}` once it accepts connections, then one JSON line per message it takes: the envelope, the
headers the tests check, and the plain-text and HTML parts as an e-mail parser reads them.

  --port N          listen on N (0: a free port)
  --defer-first     answer `451` (try again later) to the first message for each recipient
  --refuse ADDR     answer `550` (mailbox unavailable) to mail for ADDR, always
"""

import argparse
import asyncio
import email
import email.policy
import json
import socket
import sys

from aiosmtpd.controller import Controller


class Handler:
    def __init__(self, defer_first, refuse):
        self.defer_first = defer_first
        self.deferred = set()
        self.refuse = {a.lower() for a in refuse}

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address.lower() in self.refuse:
            return "550 5.1.1 mailbox unavailable"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        new = [a for a in envelope.rcpt_tos if a.lower() not in self.deferred]
        if self.defer_first and new:
            self.deferred.update(a.lower() for a in new)
            print(json.dumps({"deferred": envelope.rcpt_tos}), flush=True)
            return "451 4.3.0 try again later"
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        text = msg.get_body(preferencelist=("plain",))
        html = msg.get_body(preferencelist=("html",))
        print(
            json.dumps(
                {
                    "mail_from": envelope.mail_from,
                    "rcpt_tos": envelope.rcpt_tos,
                    "from": str(msg["From"]),
                    "to": str(msg["To"]),
                    "subject": str(msg["Subject"]),
                    "message_id": str(msg["Message-ID"]),
                    "auto_submitted": str(msg["Auto-Submitted"]),
                    "multipart": msg.get_content_type(),
                    "text": text.get_content() if text is not None else None,
                    "html": html.get_content() if html is not None else None,
                }
            ),
            flush=True,
        )
        return "250 Message accepted for delivery"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--defer-first", action="store_true")
    ap.add_argument("--refuse", action="append", default=[])
    args = ap.parse_args()
    port = args.port
    if port == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    handler = Handler(args.defer_first, args.refuse)
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    print(json.dumps({"listening": port}), flush=True)
    try:
        # Runs until the test closes standard input (or kills it).
        sys.stdin.read()
    finally:
        controller.stop()


if __name__ == "__main__":
    main()
