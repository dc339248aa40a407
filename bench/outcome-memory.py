"""What a kept outcome (--keep-outcome) costs the memory store: RSS over
run cycles (a two-step planner run each, one session each) with outcomes
kept and without. Loopback only, bounded: 6,000 cycles per server.

    CHATGATE_BIN=target/release/chatgate python3 bench/outcome-memory.py
"""
import http.client, json, subprocess, sys, time, os
def run(keep):
    port = 18090 if keep else 18091
    p = subprocess.Popen([os.environ.get("CHATGATE_BIN", "target/release/chatgate"), "--bind", f"127.0.0.1:{port}", "--step-delay", "0", "--keep-outcome", keep], stderr=subprocess.DEVNULL)
    time.sleep(1)
    def rss():
        for line in open(f"/proc/{p.pid}/status"):
            if line.startswith("VmRSS:"): return int(line.split()[1])
    def cycle(i):
        c = http.client.HTTPConnection("127.0.0.1", port)
        c.request("POST", "/api/v1/chat/stream", json.dumps({"message": "soak step; two", "session_id": f"s-{i}"}), {"Content-Type": "application/json"})
        r = c.getresponse()
        buf = b""
        while b'"stream_paused":true' not in buf:
            buf += r.read1(65536)
        c2 = http.client.HTTPConnection("127.0.0.1", port)
        c2.request("POST", "/api/v1/chat/stream", json.dumps({"message": "CONFIRM_ACTION:confirm", "session_id": f"s-{i}"}), {"Content-Type": "application/json"})
        c2.getresponse().read(); c2.close()
        while r.read1(65536): pass
        c.close()
    for i in range(1000): cycle(i)
    warm = rss()
    for i in range(1000, 6000): cycle(i)
    after = rss()
    p.kill()
    return warm, after
for keep in ("0s", "24h"):
    w, a = run(keep)
    print(keep, "warm", w, "after 5000 more", a, "per run", (a - w) * 1024 / 5000, "bytes")
