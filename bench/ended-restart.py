"""What an ended run still within its grace costs an SQLite store: the bytes
its row keeps in the file, and the memory a restart that reads it back
holds. Runs N two-step plan flows (paused, confirmed, read to their end),
one session each, with a 1 h --detach-grace; stops the server (SIGTERM);
reads the file; starts a fresh process on it and on an empty file and
compares their RSS once ready. Loopback only, bounded: N flows (default
7,500), one server at a time.

    CHATGATE_BIN=target/release/chatgate python3 bench/ended-restart.py [N]
"""
import http.client, json, os, signal, sqlite3, subprocess, sys, tempfile, time

BIN = os.environ.get("CHATGATE_BIN", "target/release/chatgate")
PORT = 18095
N = int(sys.argv[1]) if len(sys.argv) > 1 else 7500


def start(db):
    args = [BIN, "--bind", f"127.0.0.1:{PORT}", "--step-delay", "0",
            "--store", f"sqlite:{db}", "--detach-grace", "1h", "--max-runs", "200000"]
    p = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=5)
            c.request("GET", "/readyz")
            if c.getresponse().status == 200:
                return p
        except OSError:
            pass
        time.sleep(0.05)
    p.kill()
    sys.exit("the server did not become ready")


def rss_kib(p):
    for line in open(f"/proc/{p.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])


def flow(i):
    body = {"message": "soak step; two", "session_id": f"ended-{i}"}
    c = http.client.HTTPConnection("127.0.0.1", PORT)
    c.request("POST", "/api/v1/chat/stream", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    buf = b""
    while b'"stream_paused":true' not in buf:
        got = r.read1(65536)
        if not got:
            sys.exit(f"flow {i}: the stream ended before its pause")
        buf += got
    c2 = http.client.HTTPConnection("127.0.0.1", PORT)
    body = {"message": "CONFIRM_ACTION:confirm", "session_id": f"ended-{i}"}
    c2.request("POST", "/api/v1/chat/stream", json.dumps(body), {"Content-Type": "application/json"})
    assert c2.getresponse().status == 200
    c2.close()
    sent = len(buf)
    while True:
        got = r.read1(65536)
        if not got:
            break
        sent += len(got)
    c.close()
    return sent


def stop(p):
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)


with (tempfile.TemporaryDirectory() if not os.environ.get("KEEP_DIR") else open(os.devnull)) as _d:
    d = os.environ.get("KEEP_DIR") or _d
    db = os.path.join(d, "ended.db")
    p = start(db)
    started = time.time()
    streamed = sum(flow(i) for i in range(N))
    ran = time.time() - started
    stop(p)

    c = sqlite3.connect(db)
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    rows, kept = c.execute(
        "SELECT count(*), sum(length(record) + length(ended)) FROM paused_runs "
        "WHERE ended IS NOT NULL").fetchone()
    c.execute("VACUUM")
    c.close()
    size = os.path.getsize(db)

    empty = os.path.join(d, "empty.db")
    fresh = start(empty)
    time.sleep(1)
    base = rss_kib(fresh)
    stop(fresh)
    began = time.time()
    restarted = start(db)
    # The ended runs are restored oldest first: the last one's end is
    # re-attachable once all of them are.
    restored = None
    while restored is None and time.time() < began + 120:
        c = http.client.HTTPConnection("127.0.0.1", PORT)
        body = json.dumps({"session_id": f"ended-{N - 1}"})
        c.request("POST", "/api/v1/chat/stream", body,
                  {"Content-Type": "application/json", "Last-Event-ID": "0"})
        r = c.getresponse()
        r.read()
        c.close()
        if r.status == 200:
            restored = time.time() - began
        else:
            time.sleep(0.02)
    time.sleep(1)
    loaded = rss_kib(restarted)
    stop(restarted)

print(f"{N} flows in {ran:.1f} s, {streamed / N:.0f} bytes streamed per flow")
print(f"ended rows {rows}: {kept / max(rows, 1):.0f} bytes of record and end per row, "
      f"file {size / 1024:.0f} KiB after VACUUM = {size / max(rows, 1):.0f} bytes per ended run")
print(f"restart: every ended run re-attachable {restored:.2f} s after the process started")
print(f"RSS once ready: empty file {base} KiB, with the ended runs {loaded} KiB "
      f"= {(loaded - base) * 1024 / max(rows, 1):.0f} bytes per ended run")
