"""A real SMTP server for the mail tests (aiosmtpd, from tests/mcp/.venv).

    smtp_server.py PORT DIR FAILS

Listens on 127.0.0.1:PORT. Every attempt's Message-ID is appended to
DIR/attempts; the first FAILS messages are refused with 451 (try again);
the others are written to DIR/NNN.eml with their recipients in
DIR/NNN.rcpt. Prints "ready" once listening; stops when stdin closes.
"""

import json
import os
import re
import sys

from aiosmtpd.controller import Controller


class Handler:
    def __init__(self, out, fails):
        self.out = out
        self.fails = fails
        self.seen = 0

    async def handle_DATA(self, server, session, envelope):
        self.seen += 1
        content = envelope.content.decode("utf-8", "replace")
        found = re.search(r"^Message-ID:\s*(\S+)", content, re.M | re.I)
        with open(os.path.join(self.out, "attempts"), "a") as f:
            f.write((found.group(1) if found else "-") + "\n")
        if self.seen <= self.fails:
            return "451 4.3.0 try again later"
        n = len([name for name in os.listdir(self.out) if name.endswith(".eml")]) + 1
        path = os.path.join(self.out, "%03d" % n)
        with open(path + ".rcpt", "w") as f:
            json.dump(envelope.rcpt_tos, f)
        with open(path + ".eml", "w") as f:
            f.write(content)
        return "250 OK"


def main():
    port, out, fails = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    controller = Controller(Handler(out, fails), hostname="127.0.0.1", port=port)
    controller.start()
    print("ready", flush=True)
    sys.stdin.read()
    controller.stop()


if __name__ == "__main__":
    main()
