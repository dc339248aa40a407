"""What the replica suites share: free loopback ports, waiting for a
server, nginx in front of replicas, reading SSE streams raw."""

import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(url, deadline=15.0, status=200):
    """Waits until GET ``url`` answers ``status``."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == status:
                    return
        except urllib.error.HTTPError as err:
            if err.code == status:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("%s did not answer %d" % (url, status))


def start_nginx(dir, site):
    """nginx in the foreground with ``site`` (a server config's text) as its
    only site, its files in ``dir``. Returns the process."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(nginx):
        raise RuntimeError("nginx is not installed (apt-get install nginx-light)")
    with open(os.path.join(dir, "site.conf"), "w") as f:
        f.write(site)
    conf = os.path.join(dir, "nginx.conf")
    with open(conf, "w") as f:
        f.write("""
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    include {dir}/site.conf;
}}
""".format(dir=dir))
    return subprocess.Popen(
        [nginx, "-p", dir, "-e", os.path.join(dir, "error.log"), "-c", conf],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def read_until(response, pattern, limit=1 << 20):
    """Reads the response until ``pattern`` (bytes regex) matches what came."""
    seen = b""
    while not re.search(pattern, seen):
        piece = response.read1(65536)
        if not piece or len(seen) > limit:
            raise AssertionError("stream ended or grew without %r: %r" % (pattern, seen[-400:]))
        seen += piece
    return seen
