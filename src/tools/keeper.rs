//! The call keeper: a process of chatgate's between it and a command tool,
//! so that nothing a call started outlives the call, nor chatgate.
//!
//! chatgate spawns the keeper (a fork of itself that never execs); the
//! keeper makes itself the *child subreaper* of everything below it
//! (`PR_SET_CHILD_SUBREAPER`: a descendant whose parent dies, a `setsid`
//! daemon included, is reparented to the keeper rather than to init), forks
//! the tool into a process group of its own, and waits. When the tool
//! exits, every descendant still alive is killed (`SIGKILL`, repeated until
//! none is left: each kill reparents the victim's children to the keeper),
//! and the keeper exits as the tool did, so chatgate reads the tool's exit
//! status from it. Asked to stop (`SIGTERM` from chatgate, on a timeout or a
//! stop), it passes `SIGTERM` to the tool's group and, [`KILL_GRACE`] later,
//! kills everything. The keeper dies with chatgate (`PR_SET_PDEATHSIG`), and
//! kills everything first; the tool dies with its keeper.
//!
//! What it does not cover: a descendant that escapes the process tree (a
//! `systemd-run` unit, a daemon handed to another service manager, a
//! process in another PID namespace), and a descendant that is stopped
//! (`SIGSTOP`) when chatgate is killed with `SIGKILL` and the keeper gets no
//! time (it kills them anyway: `SIGKILL` reaches stopped processes). The
//! keeper finds descendants through `/proc/thread-self/children`; on a
//! kernel without it (no `CONFIG_PROC_CHILDREN`) only the tool's own process
//! group is killed.
//!
//! Everything here runs in a freshly forked child of a multi-threaded
//! process: only async-signal-safe calls (fork, prctl, waitpid, kill, open,
//! read, close, alarm, sigaction, _exit), no allocation, no locks.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Time between `SIGTERM` and `SIGKILL` for a call that must stop.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// Set in the keeper by `SIGTERM`: pass it on, and arm the kill.
static TERMINATE: AtomicBool = AtomicBool::new(false);
/// Set in the keeper by `SIGALRM` (the grace is over) or by chatgate's
/// death (`SIGUSR2`): kill everything.
static KILL: AtomicBool = AtomicBool::new(false);

extern "C" fn on_terminate(_: libc::c_int) {
    TERMINATE.store(true, Ordering::SeqCst);
}

extern "C" fn on_kill(_: libc::c_int) {
    KILL.store(true, Ordering::SeqCst);
}

/// The one way chatgate starts a program of the tools file (a command
/// tool's call, a stdio MCP server): `argv` with piped stdio, through a
/// keeper (below) in a process group of its own, killed when dropped, in
/// `cwd` if given, with an environment of `PATH` and the variables `env`
/// names only (the allow-list: nothing else of chatgate's, its secrets
/// included, reaches it).
pub fn command(
    argv: &[String],
    env: &[String],
    cwd: Option<&std::path::Path>,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .env_clear()
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        // The keeper's own group: signals for it never reach the tool's.
        .process_group(0)
        // A run that ends while its program runs must not leave it behind.
        .kill_on_drop(true);
    keep(&mut command);
    if let Some(path) = std::env::var_os("PATH") {
        command.env("PATH", path);
    }
    for name in env {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    if let Some(dir) = cwd {
        command.current_dir(dir);
    }
    command
}

/// Makes `command` spawn a keeper that runs the tool (see the module docs).
/// The spawned process is the keeper: signal it, not its group.
pub fn keep(command: &mut tokio::process::Command) {
    let chatgate = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and calls
    // only async-signal-safe functions (see `split`).
    unsafe {
        command.pre_exec(move || split(chatgate));
    }
}

/// In the forked child: becomes the keeper (never returns) and forks the
/// tool, which returns `Ok` and goes on to exec.
///
/// # Safety
/// Async-signal-safe calls only: this runs between fork and exec.
unsafe fn split(chatgate: libc::pid_t) -> io::Result<()> {
    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGUSR2) != 0 {
        return Err(io::Error::last_os_error());
    }
    if libc::getppid() != chatgate {
        // chatgate died between the fork and the line above.
        libc::_exit(127);
    }
    libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
    let keeper = libc::getpid();
    match libc::fork() {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            // The tool: a group of its own (the keeper's group is the one
            // chatgate signals), and it dies with its keeper.
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            // chatgate ignores it (see main); a tool gets the default.
            libc::signal(libc::SIGXFSZ, libc::SIG_DFL);
            if libc::getppid() != keeper {
                libc::_exit(127);
            }
            Ok(())
        }
        tool => keep_until_done(tool),
    }
}

/// The keeper's life: holds none of chatgate's files, waits for the tool,
/// cleans up, exits as the tool did.
unsafe fn keep_until_done(tool: libc::pid_t) -> ! {
    close_everything();
    handle(libc::SIGTERM, on_terminate);
    handle(libc::SIGALRM, on_kill);
    handle(libc::SIGUSR2, on_kill);
    let mut unblock: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut unblock);
    for signal in [libc::SIGTERM, libc::SIGALRM, libc::SIGUSR2] {
        libc::sigaddset(&mut unblock, signal);
    }
    libc::sigprocmask(libc::SIG_UNBLOCK, &unblock, std::ptr::null_mut());
    let mut status: libc::c_int = 0;
    loop {
        if KILL.load(Ordering::SeqCst) {
            kill_group_and_children(tool);
        } else if TERMINATE.swap(false, Ordering::SeqCst) {
            libc::kill(-tool, libc::SIGTERM);
            libc::alarm(KILL_GRACE.as_secs() as libc::c_uint);
        }
        let reaped = libc::waitpid(-1, &mut status, 0);
        if reaped == tool {
            break;
        }
        if reaped < 0 && *libc::__errno_location() == libc::ECHILD {
            // Cannot happen while the tool lives; nothing left to wait for.
            libc::_exit(127);
        }
        // Interrupted by a signal (looked at above), or an orphan of the
        // call that ended: reaped, go on.
    }
    kill_everything_left(tool);
    if libc::WIFSIGNALED(status) {
        // Die as the tool died, so chatgate reads the same status.
        let signal = libc::WTERMSIG(status);
        libc::signal(signal, libc::SIG_DFL);
        let mut only: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut only);
        libc::sigaddset(&mut only, signal);
        libc::sigprocmask(libc::SIG_UNBLOCK, &only, std::ptr::null_mut());
        libc::kill(libc::getpid(), signal);
    }
    libc::_exit(libc::WEXITSTATUS(status))
}

/// Closes every file descriptor: the pipes to chatgate (so that their end
/// depends on the tool and its descendants only), its client sockets, and
/// the pipe on which chatgate waits for the exec (so that the spawn returns).
unsafe fn close_everything() {
    if libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) == 0 {
        return;
    }
    let max = match libc::sysconf(libc::_SC_OPEN_MAX) {
        n if n > 0 => n as libc::c_int,
        _ => 65_536,
    };
    for fd in 0..max {
        libc::close(fd);
    }
}

unsafe fn handle(signal: libc::c_int, handler: extern "C" fn(libc::c_int)) {
    let mut action: libc::sigaction = std::mem::zeroed();
    action.sa_sigaction = handler as usize;
    // No SA_RESTART: a signal interrupts waitpid, and the loop looks.
    action.sa_flags = 0;
    libc::sigemptyset(&mut action.sa_mask);
    libc::sigaction(signal, &action, std::ptr::null_mut());
}

/// `SIGKILL` to the tool's group and to every child of the keeper.
unsafe fn kill_group_and_children(tool: libc::pid_t) {
    libc::kill(-tool, libc::SIGKILL);
    for_each_child(|pid| {
        libc::kill(pid, libc::SIGKILL);
    });
}

/// After the tool's end: kills every descendant still alive, reaping as it
/// goes (a killed process's children are reparented here, and killed next).
unsafe fn kill_everything_left(tool: libc::pid_t) {
    libc::kill(-tool, libc::SIGKILL);
    loop {
        let mut any = false;
        let listed = for_each_child(|pid| {
            any = true;
            libc::kill(pid, libc::SIGKILL);
        });
        if !listed {
            // No way to list them: reap what has already ended, and go.
            while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {}
            return;
        }
        if !any {
            return;
        }
        // One of them ends (SIGKILL cannot be ignored); look again.
        libc::waitpid(-1, std::ptr::null_mut(), 0);
    }
}

/// Calls `each` with the pid of every child of this (single-threaded)
/// process, from `/proc/thread-self/children`. False when it cannot be read.
unsafe fn for_each_child(mut each: impl FnMut(libc::pid_t)) -> bool {
    let fd = libc::open(
        c"/proc/thread-self/children".as_ptr(),
        libc::O_RDONLY | libc::O_CLOEXEC,
    );
    if fd < 0 {
        return false;
    }
    let mut buf = [0u8; 4096];
    let mut pid: libc::pid_t = 0;
    let mut digits = false;
    loop {
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        if n <= 0 {
            break;
        }
        for &byte in &buf[..n as usize] {
            if byte.is_ascii_digit() {
                pid = pid * 10 + libc::pid_t::from(byte - b'0');
                digits = true;
            } else if digits {
                each(pid);
                pid = 0;
                digits = false;
            }
        }
    }
    if digits {
        each(pid);
    }
    libc::close(fd);
    true
}
