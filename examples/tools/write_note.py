#!/usr/bin/env python3
"""A harmless command tool: appends the call's `step` to notes.txt in the
directory given as its argument (created if missing) and prints what it
wrote. The arguments arrive on stdin as one JSON object; see docs/tools.md."""

import json
import os
import sys


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: write_note.py DIRECTORY (the call's JSON on stdin)\n")
        return 2
    args = json.load(sys.stdin)
    note = str(args.get("step", "")).replace("\n", " ")
    os.makedirs(sys.argv[1], exist_ok=True)
    path = os.path.join(sys.argv[1], "notes.txt")
    with open(path, "a", encoding="utf-8") as notes:
        notes.write(note + "\n")
    print("noted in %s: %s" % (path, note))
    return 0


if __name__ == "__main__":
    sys.exit(main())
