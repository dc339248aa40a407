//! `--store URL`: the bench starts chatgate itself, on free loopback ports,
//! with that store (and, for `redis://`, as replicas of one cluster), and
//! stops it when done.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A chatgate process the bench started; stopped (SIGTERM) on drop.
pub struct Server {
    child: Child,
    /// `127.0.0.1:PORT`
    pub addr: String,
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How to start a server again, for a scenario that restarts it.
pub struct Spec {
    pub bin: Option<std::path::PathBuf>,
    pub store: String,
    pub extra: Vec<String>,
}

/// Starts `count` servers with `store`: one, or replicas sharing a Redis.
pub fn start(
    bin: Option<&Path>,
    store: &str,
    count: usize,
    extra: &[String],
) -> io::Result<Vec<Server>> {
    let bin = match bin {
        Some(bin) => bin.to_owned(),
        None => std::env::current_exe()?.with_file_name("chatgate"),
    };
    let redis = store.starts_with("redis://");
    if count > 1 && !redis {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "several servers share runs only with --store redis://",
        ));
    }
    let mut servers = Vec::with_capacity(count);
    for i in 0..count {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr = format!("127.0.0.1:{port}");
        let mut command = Command::new(&bin);
        command
            .args(["--bind", &addr, "--step-delay", "0", "--store", store])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if redis {
            command.args([
                "--replica-id",
                &format!("bench-{i}"),
                "--advertise-url",
                &format!("http://{addr}"),
                "--cluster-secret",
                "chatgate-bench-cluster-secret",
            ]);
        }
        let child = command.spawn().map_err(|err| {
            io::Error::new(err.kind(), format!("cannot start {}: {err}", bin.display()))
        })?;
        let server = Server { child, addr };
        wait_ready(&server.addr)?;
        servers.push(server);
    }
    Ok(servers)
}

/// Waits until `GET /readyz` answers 200 (10 s at most).
fn wait_ready(addr: &str) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(mut conn) = TcpStream::connect(addr) {
            let request =
                format!("GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
            let mut head = [0u8; 12];
            if conn.write_all(request.as_bytes()).is_ok()
                && conn.read_exact(&mut head).is_ok()
                && head.ends_with(b"200")
            {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        format!("chatgate at {addr} did not become ready"),
    ))
}
