//! chatgate-bench: measures a running chatgate server from outside, like a
//! user would, over raw HTTP/1.1 on loopback. Start the server with
//! `--step-delay-ms 0`. See docs/benchmarks.md for the commands and results.

mod http;
mod mcp;
mod parked;
mod quorum;
mod receiver;
mod servers;
mod stats;
mod tasks;

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

use http::{Conn, Kind};
use stats::Samples;

#[derive(Parser)]
#[command(about = "Load generator for chatgate (loopback only)")]
struct Cli {
    /// Server address; must be on loopback.
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: String,
    /// Client runtime threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Start chatgate itself with this store (`memory`, `sqlite:PATH`,
    /// `redis://HOST:PORT/DB`) on a free loopback port instead of using the
    /// server at --addr; with `redis://`, `cross` starts two replicas.
    #[arg(long)]
    store: Option<String>,
    /// The chatgate binary --store starts (default: beside this one).
    #[arg(long)]
    server_bin: Option<std::path::PathBuf>,
    /// An extra argument for the server --store starts (repeatable), e.g.
    /// `--server-arg=--max-runs=200000`.
    #[arg(long, allow_hyphen_values = true)]
    server_arg: Vec<String>,
    /// With --store: start a webhook receiver on loopback, point the
    /// server's --webhook at it, and report the events it got.
    #[arg(long)]
    webhook_receiver: bool,
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand)]
enum Scenario {
    /// Sequential GET /healthz round trips on one connection.
    Floor {
        #[arg(long, default_value_t = 5000)]
        n: usize,
    },
    /// Sequential full confirm flows; with --paused K, K other runs stay paused meanwhile.
    Rtt {
        #[arg(long, default_value_t = 2000)]
        n: usize,
        #[arg(long, default_value_t = 0)]
        paused: usize,
    },
    /// Open K paused runs, sample server RSS, then confirm them all.
    Paused {
        #[arg(long, default_value_t = 10000)]
        k: usize,
        /// Server pid, to read its RSS from /proc.
        #[arg(long)]
        server_pid: Option<u32>,
        /// Concurrent openers / confirmers.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Open and measure only; never confirm (for `actix-floor`, which
        /// cannot resume).
        #[arg(long)]
        hold_only: bool,
        /// Drop every stream's connection once its run has paused: the runs
        /// wait detached, with no socket. RSS is sampled 3 s later, once the
        /// server has noticed (start it with `--keep-alive 50ms`, or pass
        /// `--server-arg=--keep-alive=50ms`, so that few connections wait
        /// to be noticed); then every run is confirmed by a reply alone.
        #[arg(long)]
        detach: bool,
        /// Pause each run on a question (an `input_request`) instead of a
        /// plan; the runs are then released by a cancel.
        #[arg(long)]
        question: bool,
    },
    /// Open K paused runs, drop their clients, wait until every one is
    /// parked (#46; start the server with `--park-after 0s`), then measure
    /// RSS, the store's file, CPU while idle, and decisions one at a time.
    Parked {
        #[arg(long, default_value_t = 1_000_000)]
        k: usize,
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Decisions measured, one at a time, on runs spread over the K.
        #[arg(long, default_value_t = 2000)]
        decide: usize,
        /// Seconds of idling measured with them parked.
        #[arg(long, default_value_t = 60)]
        idle: u64,
        #[arg(long)]
        server_pid: Option<u32>,
    },
    /// K paused runs all due at once (#46): needs --store (the bench opens
    /// them, stops the server, waits past their `--confirm-timeout` and
    /// starts it again); with --webhook-receiver, also until every
    /// `interaction.expired` webhook is delivered.
    Expiry {
        #[arg(long, default_value_t = 100_000)]
        k: usize,
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Their `--confirm-timeout`, in seconds.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Sequential flows, alternately paused on a plan (confirm→resume) and
    /// on a question (answer→resume), on the same connections: both
    /// resumes and their ratio.
    Question {
        #[arg(long, default_value_t = 2000)]
        n: usize,
    },
    /// Sequential full flows, alternately on the chat endpoint (start,
    /// confirm, completion) and on the AG-UI face (start to its interrupt,
    /// resume to RUN_FINISHED), from the same client: both flows' times
    /// and their ratio.
    Agui {
        #[arg(long, default_value_t = 2000)]
        n: usize,
    },
    /// C concurrent clients doing full flows for T seconds.
    Throughput {
        #[arg(long, default_value_t = 32)]
        clients: usize,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
    /// C concurrent clients streaming plain answers for T seconds.
    Chat {
        #[arg(long, default_value_t = 32)]
        clients: usize,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
    /// Confirmed calls of a declared command tool (start the server with
    /// `--tools bench/tools.toml`): time from the confirm to its
    /// `tool_output`, against running the same command directly; or of an
    /// MCP server's tool (`--tools bench/mcp.toml`, `--mcp-server ...`),
    /// against calling that server directly with a minimal client.
    Tool {
        #[arg(long, default_value_t = 300)]
        n: usize,
        /// The declared tool's name (its steps start with it).
        #[arg(long, default_value = "trivial")]
        tool: String,
        /// The command the tool runs, to time directly for comparison.
        #[arg(long, num_args = 1.., default_values = ["cat"])]
        direct: Vec<String>,
        /// The step's arguments after the tool's name (an MCP tool takes a
        /// JSON object: `--args '{"text": "hi"}'`); default `call`.
        #[arg(long, default_value = "call")]
        args: String,
        /// For a tool of an MCP server: the server's command, called
        /// directly by a minimal client for comparison (instead of
        /// `--direct`).
        #[arg(long, num_args = 1..)]
        mcp_server: Vec<String>,
        /// The tool's name on that server.
        #[arg(long, default_value = "echo")]
        mcp_tool: String,
    },
    /// A call a rule (or a grant) allows against the same call asked and
    /// confirmed (start the server with `--tools bench/rules.toml`: 255
    /// rules that never match before the one that allows): start→completion
    /// of each, interleaved on the same connections, and their ratio.
    Allowed {
        #[arg(long, default_value_t = 1000)]
        n: usize,
        /// Only the asked flows (for an A/B of the rules' cost against a
        /// server without rules, `--tools bench/tools.toml`).
        #[arg(long)]
        asked_only: bool,
    },
    /// A call one yes decides against one two approvers decide (start the
    /// server with `--tools bench/quorum.toml --api-keys-file
    /// bench/quorum-keys.txt`): start→completion of each, and what the
    /// second approver adds against one confirm round trip.
    Quorum {
        #[arg(long, default_value_t = 1000)]
        n: usize,
    },
    /// A three-task plan confirmed at once against one decided task by
    /// task (`CONFIRM_ACTION:decide`, #42): start→completion of each, a
    /// decide's round trip, and what the extra decides add.
    Tasks {
        #[arg(long, default_value_t = 1000)]
        n: usize,
    },
    /// Confirm flows whose reply lands on the replica that holds the run
    /// and on one that does not (it forwards), interleaved: confirm→resume
    /// of each and their ratio. Needs --other, or --store redis://.
    Cross {
        #[arg(long, default_value_t = 1000)]
        n: usize,
        /// Another replica of the same cluster, for the replies.
        #[arg(long)]
        other: Option<String>,
    },
    /// Every scenario in turn (floor, rtt, rtt with 10k paused, throughput, chat, paused 1k..15k).
    All {
        #[arg(long)]
        server_pid: Option<u32>,
    },
}

fn main() -> io::Result<()> {
    let cli = Cli::parse();
    let ip = cli.addr.rsplit_once(':').map(|(h, _)| h).unwrap_or("");
    if !(ip.starts_with("127.") || ip == "localhost" || ip == "[::1]") {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "chatgate-bench only talks to loopback",
        ));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.threads.max(1))
        .enable_all()
        .build()?;
    // `cross`, and `parked` on Redis (its decisions go to the other), start
    // two replicas.
    let redis = cli
        .store
        .as_deref()
        .is_some_and(|s| s.starts_with("redis://"));
    let two = match cli.scenario {
        Scenario::Cross { .. } => true,
        Scenario::Parked { .. } => redis,
        _ => false,
    };
    let replicas = usize::from(two) + 1;
    let receiver = match (cli.webhook_receiver, &cli.store) {
        (false, _) => None,
        (true, Some(_)) => Some(receiver::Receiver::start()?),
        (true, None) => {
            return Err(err(
                "--webhook-receiver needs --store (the bench starts the server)",
            ))
        }
    };
    let mut server_args = cli.server_arg.clone();
    server_args.extend(receiver.iter().flat_map(receiver::Receiver::server_args));
    let restarts = matches!(cli.scenario, Scenario::Expiry { .. });
    let spec = cli.store.clone().map(|store| servers::Spec {
        bin: cli.server_bin.clone(),
        store,
        extra: server_args.clone(),
    });
    let started = match &cli.store {
        Some(_) if restarts => Vec::new(),
        Some(store) => servers::start(cli.server_bin.as_deref(), store, replicas, &server_args)?,
        None => Vec::new(),
    };
    let spawned_pid = started.first().map(|server| server.pid());
    let addr = started
        .first()
        .map_or(cli.addr, |server| server.addr.clone());
    let scenario = match cli.scenario {
        Scenario::Paused {
            k,
            server_pid,
            concurrency,
            hold_only,
            detach,
            question,
        } => Scenario::Paused {
            k,
            server_pid: server_pid.or(spawned_pid),
            concurrency,
            hold_only,
            detach,
            question,
        },
        Scenario::Cross { n, other } => Scenario::Cross {
            n,
            other: other.or_else(|| started.get(1).map(|server| server.addr.clone())),
        },
        Scenario::All { server_pid } => Scenario::All {
            server_pid: server_pid.or(spawned_pid),
        },
        Scenario::Parked {
            k,
            concurrency,
            decide,
            idle,
            server_pid,
        } => Scenario::Parked {
            k,
            concurrency,
            decide,
            idle,
            server_pid: server_pid.or(spawned_pid),
        },
        other => other,
    };
    let other = started.get(1).map(|server| server.addr.clone());
    let announced = cli.webhook_receiver;
    let result = runtime.block_on(async move {
        let addr: Arc<str> = addr.into();
        match scenario {
            Scenario::Floor { n } => floor(&addr, n).await.map(drop),
            Scenario::Rtt { n, paused } => rtt(&addr, n, paused).await,
            Scenario::Paused {
                k,
                server_pid,
                concurrency,
                detach: true,
                question,
                ..
            } => detached(&addr, k, server_pid, concurrency, Pause::of(question)).await,
            Scenario::Paused {
                k,
                server_pid,
                concurrency,
                hold_only,
                detach: false,
                question,
            } => {
                let pause = Pause::of(question);
                paused(&addr, k, server_pid, concurrency, hold_only, pause).await
            }
            Scenario::Parked {
                k,
                concurrency,
                decide,
                idle,
                server_pid,
            } => {
                let file = spec
                    .as_ref()
                    .and_then(|spec| spec.store.strip_prefix("sqlite:"));
                let file = file.map(std::path::Path::new);
                let at = parked::At {
                    addr: &addr,
                    other: other.as_deref(),
                    server_pid,
                    file,
                };
                parked::parked(at, k, concurrency, decide, idle).await
            }
            Scenario::Expiry {
                k,
                concurrency,
                timeout,
            } => match &spec {
                Some(spec) => parked::expiry(spec, k, concurrency, timeout, announced).await,
                None => Err(err("expiry needs --store (the bench restarts the server)")),
            },
            Scenario::Question { n } => question_rtt(&addr, n).await,
            Scenario::Agui { n } => agui_rtt(&addr, n).await,
            Scenario::Throughput { clients, seconds } => throughput(&addr, clients, seconds).await,
            Scenario::Chat { clients, seconds } => chat(&addr, clients, seconds).await,
            Scenario::Tool {
                n,
                tool,
                direct,
                args,
                mcp_server,
                mcp_tool,
            } => {
                let floor = if mcp_server.is_empty() {
                    Floor::Command(direct)
                } else {
                    Floor::Mcp(mcp_server, mcp_tool)
                };
                tool_calls(&addr, n, &tool, &args, floor).await
            }
            Scenario::Allowed { n, asked_only } => allowed(&addr, n, asked_only).await,
            Scenario::Quorum { n } => quorum::quorum(&addr, n).await,
            Scenario::Tasks { n } => tasks::tasks(&addr, n).await,
            Scenario::Cross { n, other } => {
                let other =
                    other.ok_or_else(|| err("cross needs --other ADDR or --store redis://"))?;
                cross(&addr, &other, n).await
            }
            Scenario::All { server_pid } => {
                floor(&addr, 5000).await?;
                rtt(&addr, 2000, 0).await?;
                rtt(&addr, 2000, 10_000).await?;
                throughput(&addr, 32, 10).await?;
                chat(&addr, 32, 10).await?;
                for k in [1000, 5000, 10_000, 15_000] {
                    paused(&addr, k, server_pid, 64, false, Pause::PLAN).await?;
                }
                Ok(())
            }
        }
    });
    if let Some(receiver) = &receiver {
        receiver.report(Instant::now());
    }
    drop(started);
    result
}

fn err(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_owned())
}

/// A unique session id per flow.
fn session_json(buf: &mut Vec<u8>, prefix: &str, n: usize, message: &str) {
    buf.clear();
    buf.extend_from_slice(b"{\"message\":\"");
    buf.extend_from_slice(message.as_bytes());
    buf.extend_from_slice(b"\",\"session_id\":\"");
    buf.extend_from_slice(prefix.as_bytes());
    buf.extend_from_slice(n.to_string().as_bytes());
    buf.extend_from_slice(b"\"}");
}

fn reply_json(buf: &mut Vec<u8>, prefix: &str, n: usize, confirmation_id: &[u8; 36]) {
    reply_with(buf, "confirm", prefix, n, confirmation_id);
}

/// A reply `CONFIRM_ACTION:<action>` to the pause `confirmation_id`.
fn reply_with(buf: &mut Vec<u8>, action: &str, prefix: &str, n: usize, confirmation_id: &[u8; 36]) {
    buf.clear();
    buf.extend_from_slice(b"{\"message\":\"CONFIRM_ACTION:");
    buf.extend_from_slice(action.as_bytes());
    buf.extend_from_slice(b"\",\"session_id\":\"");
    buf.extend_from_slice(prefix.as_bytes());
    buf.extend_from_slice(n.to_string().as_bytes());
    buf.extend_from_slice(b"\",\"confirmation_id\":\"");
    buf.extend_from_slice(confirmation_id);
    buf.extend_from_slice(b"\"}");
}

async fn floor(addr: &str, n: usize) -> io::Result<stats::Summary> {
    let mut conn = Conn::connect(addr).await?;
    for _ in 0..200 {
        conn.get("/healthz").await?;
    }
    let mut samples = Samples::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        if conn.get("/healthz").await? != 200 {
            return Err(err("healthz not 200"));
        }
        samples.push(start.elapsed());
    }
    let summary = samples.summary();
    println!("floor       GET /healthz         {summary}");
    Ok(summary)
}

/// Timings of one full flow.
struct Flow {
    first_chunk: Duration,
    resume: Duration,
    ack: Duration,
    total: Duration,
}

/// One flow on a pair of persistent connections: start a task on `stream`,
/// confirm on `reply`, read the stream to its final chunk.
async fn flow(
    stream: &mut Conn,
    reply: &mut Conn,
    buf: &mut Vec<u8>,
    prefix: &str,
    n: usize,
) -> io::Result<Flow> {
    session_json(buf, prefix, n, "step one; step two");
    let start = Instant::now();
    if stream.post_chat(buf).await? != 200 {
        return Err(err("start not 200"));
    }
    let (confirmation_id, first_chunk) = pause_of(stream, Kind::ConfirmationRequest, start).await?;
    reply_json(buf, prefix, n, &confirmation_id);
    let (ack, resume) = decide(stream, reply, buf).await?;
    let (_, last) = stream.read_to_end().await?;
    if last.kind != Kind::Completion {
        return Err(err("flow did not complete"));
    }
    Ok(Flow {
        first_chunk,
        resume,
        ack,
        total: start.elapsed(),
    })
}

/// The message of a question flow: one question, then a plan that uses it.
const QUESTION_MESSAGE: &str = "ask region: which region? eu-west | us-east; step one in {region}";

/// One question flow: start a task that asks first on `stream`, answer on
/// `reply` (timed as [`flow`] times a confirm), then confirm the plan that
/// follows and read the stream to its final chunk.
async fn question_flow(
    stream: &mut Conn,
    reply: &mut Conn,
    buf: &mut Vec<u8>,
    prefix: &str,
    n: usize,
) -> io::Result<Flow> {
    session_json(buf, prefix, n, QUESTION_MESSAGE);
    let start = Instant::now();
    if stream.post_chat(buf).await? != 200 {
        return Err(err("start not 200"));
    }
    let (question_id, first_chunk) = pause_of(stream, Kind::InputRequest, start).await?;
    reply_with(buf, "answer:eu-west", prefix, n, &question_id);
    let (ack, resume) = decide(stream, reply, buf).await?;
    let (plan_id, _) = pause_of(stream, Kind::ConfirmationRequest, start).await?;
    reply_json(buf, prefix, n, &plan_id);
    decide(stream, reply, buf).await?;
    let (_, last) = stream.read_to_end().await?;
    if last.kind != Kind::Completion {
        return Err(err("question flow did not complete"));
    }
    Ok(Flow {
        first_chunk,
        resume,
        ack,
        total: start.elapsed(),
    })
}

/// Reads `stream` to its pause of `kind`: its confirmation id, and when the
/// first chunk came (after `start`).
async fn pause_of(
    stream: &mut Conn,
    kind: Kind,
    start: Instant,
) -> io::Result<([u8; 36], Duration)> {
    let mut first_chunk = None;
    loop {
        let event = stream
            .next_event()
            .await?
            .ok_or_else(|| err("ended before pause"))?;
        if event.comment {
            continue;
        }
        first_chunk.get_or_insert_with(|| start.elapsed());
        if event.kind == kind {
            let id = event
                .confirmation_id
                .ok_or_else(|| err("no confirmation id"))?;
            return Ok((id, first_chunk.unwrap_or_default()));
        }
        if event.finished {
            return Err(err("finished before pause"));
        }
    }
}

/// Sends the reply in `buf` on `reply` and times, from the send, its
/// acknowledgement and the resumed `confirmation_received` on `stream`.
async fn decide(
    stream: &mut Conn,
    reply: &mut Conn,
    buf: &[u8],
) -> io::Result<(Duration, Duration)> {
    let sent = Instant::now();
    // The acknowledgement and the resumed stream race; time each on arrival.
    let acknowledged = async {
        if reply.post_chat(buf).await? != 200 {
            return Err(err("reply not 200"));
        }
        let (_, ack_event) = reply.read_to_end().await?;
        if ack_event.kind != Kind::ConfirmationReceived {
            return Err(err("reply not acknowledged"));
        }
        Ok(sent.elapsed())
    };
    let resumed = async {
        let resumed = loop {
            let event = stream
                .next_event()
                .await?
                .ok_or_else(|| err("ended before resume"))?;
            if !event.comment {
                break event;
            }
        };
        if resumed.kind != Kind::ConfirmationReceived {
            return Err(err("stream did not resume with confirmation_received"));
        }
        Ok(sent.elapsed())
    };
    tokio::try_join!(acknowledged, resumed)
}

/// Plan flows and question flows, alternately, on the same connections:
/// confirm→resume against answer→resume.
async fn question_rtt(addr: &str, n: usize) -> io::Result<()> {
    let (mut stream, mut reply) = (Conn::connect(addr).await?, Conn::connect(addr).await?);
    let mut buf = Vec::with_capacity(256);
    for i in 0..200 {
        flow(&mut stream, &mut reply, &mut buf, "qwarm", i).await?;
        question_flow(&mut stream, &mut reply, &mut buf, "qwarmq", i).await?;
    }
    let (mut confirm, mut answer) = (Samples::with_capacity(n), Samples::with_capacity(n));
    for i in 0..n {
        confirm.push(
            flow(&mut stream, &mut reply, &mut buf, "qplan", i)
                .await?
                .resume,
        );
        answer.push(
            question_flow(&mut stream, &mut reply, &mut buf, "qask", i)
                .await?
                .resume,
        );
    }
    let (confirm, answer) = (confirm.summary(), answer.summary());
    println!("question rtt (plan and question flows alternately, {n} each)");
    println!("  confirm→resume   {confirm}");
    println!("  answer→resume    {answer}");
    println!(
        "  answer/confirm p50 ratio {:.2}",
        answer.p50 as f64 / confirm.p50.max(1) as f64
    );
    Ok(())
}

async fn agui_rtt(addr: &str, n: usize) -> io::Result<()> {
    let (mut stream, mut reply) = (Conn::connect(addr).await?, Conn::connect(addr).await?);
    let mut agui = Conn::connect(addr).await?;
    let (mut buf, mut body) = (Vec::with_capacity(512), Vec::with_capacity(8192));
    for i in 0..200 {
        flow(&mut stream, &mut reply, &mut buf, "awarm", i).await?;
        agui_flow(&mut agui, &mut buf, &mut body, "awarmg", i).await?;
    }
    let (mut chat, mut face) = (Samples::with_capacity(n), Samples::with_capacity(n));
    for i in 0..n {
        chat.push(
            flow(&mut stream, &mut reply, &mut buf, "achat", i)
                .await?
                .total,
        );
        face.push(agui_flow(&mut agui, &mut buf, &mut body, "aagui", i).await?);
    }
    let (chat, face) = (chat.summary(), face.summary());
    println!("agui rtt (a 2-task plan approved, {n} flows each, alternately)");
    println!("  chat endpoint flow  {chat}");
    println!("  AG-UI face flow     {face}");
    println!(
        "  AG-UI / chat p50 ratio {:.2}, p99 ratio {:.2}",
        face.p50 as f64 / chat.p50.max(1) as f64,
        face.p99 as f64 / chat.p99.max(1) as f64
    );
    Ok(())
}

/// One AG-UI flow on `conn`: a run to its interrupt, then a resume that
/// approves both tasks, read to its `RUN_FINISHED`.
async fn agui_flow(
    conn: &mut Conn,
    buf: &mut Vec<u8>,
    body: &mut Vec<u8>,
    prefix: &str,
    n: usize,
) -> io::Result<Duration> {
    use std::io::Write;
    const PATH: &[u8] = b"/api/v1/agui";
    buf.clear();
    write!(
        buf,
        r#"{{"threadId":"{prefix}-{n}","runId":"r1","messages":[{{"id":"1","role":"user","content":"step one; step two"}}]}}"#
    )?;
    let start = Instant::now();
    if conn.post_to(PATH, buf).await? != 200 {
        return Err(err("AG-UI start not 200"));
    }
    conn.read_body(body).await?;
    let cid = http::between(body, b"\"confirmation_id\":\"", b'"')
        .ok_or_else(|| err("AG-UI run did not end with an interrupt"))?;
    let cid = String::from_utf8_lossy(cid).into_owned();
    buf.clear();
    write!(
        buf,
        r#"{{"threadId":"{prefix}-{n}","runId":"r2","messages":[],"resume":[{{"interruptId":"{cid}-t1","status":"resolved","payload":{{"approved":true}}}},{{"interruptId":"{cid}-t2","status":"resolved","payload":{{"approved":true}}}}]}}"#
    )?;
    if conn.post_to(PATH, buf).await? != 200 {
        return Err(err("AG-UI resume not 200"));
    }
    conn.read_body(body).await?;
    if http::find(body, br#""outcome":{"type":"success"}"#).is_none() {
        return Err(err("AG-UI resume did not finish with success"));
    }
    Ok(start.elapsed())
}

/// Flows on one stream connection to `addr`, confirmed alternately on
/// `addr` (the owner) and on `other` (a replica that forwards the reply).
async fn cross(addr: &str, other: &str, n: usize) -> io::Result<()> {
    let mut stream = Conn::connect(addr).await?;
    let mut same = Conn::connect(addr).await?;
    let mut elsewhere = Conn::connect(other).await?;
    let mut buf = Vec::with_capacity(256);
    for i in 0..200 {
        flow(&mut stream, &mut same, &mut buf, "warm-same", i).await?;
        flow(&mut stream, &mut elsewhere, &mut buf, "warm-cross", i).await?;
    }
    let (mut same_resume, mut cross_resume) =
        (Samples::with_capacity(n), Samples::with_capacity(n));
    let (mut same_ack, mut cross_ack) = (Samples::with_capacity(n), Samples::with_capacity(n));
    for i in 0..n {
        let f = flow(&mut stream, &mut same, &mut buf, "same", i).await?;
        same_resume.push(f.resume);
        same_ack.push(f.ack);
        let f = flow(&mut stream, &mut elsewhere, &mut buf, "cross", i).await?;
        cross_resume.push(f.resume);
        cross_ack.push(f.ack);
    }
    let (same, cross) = (same_resume.summary(), cross_resume.summary());
    println!("cross-replica (stream on {addr}, replies on {addr} / {other})");
    println!("  confirm→resume, same replica   {same}");
    println!("  confirm→resume, cross replica  {cross}");
    println!("  reply ack, same replica        {}", same_ack.summary());
    println!("  reply ack, cross replica       {}", cross_ack.summary());
    println!(
        "  cross / same p50: {:.2}x",
        cross.p50 as f64 / same.p50.max(1) as f64
    );
    Ok(())
}

async fn rtt(addr: &str, n: usize, background_paused: usize) -> io::Result<()> {
    let held = if background_paused > 0 {
        Some(open_paused(addr, background_paused, 64, "bg", Pause::PLAN).await?)
    } else {
        None
    };
    let (mut stream, mut reply) = (Conn::connect(addr).await?, Conn::connect(addr).await?);
    let mut probe = Conn::connect(addr).await?;
    let mut buf = Vec::with_capacity(256);
    for i in 0..200 {
        flow(&mut stream, &mut reply, &mut buf, "warm", i).await?;
        probe.get("/healthz").await?;
    }
    let (mut floor, mut ttfc, mut resume, mut ack, mut total) = (
        Samples::with_capacity(n),
        Samples::with_capacity(n),
        Samples::with_capacity(n),
        Samples::with_capacity(n),
        Samples::with_capacity(n),
    );
    for i in 0..n {
        // The floor is sampled between flows, so both see the same machine:
        // on two shared cores it moves with scheduling from run to run.
        let start = Instant::now();
        if probe.get("/healthz").await? != 200 {
            return Err(err("healthz not 200"));
        }
        floor.push(start.elapsed());
        let f = flow(&mut stream, &mut reply, &mut buf, "rtt", i).await?;
        ttfc.push(f.first_chunk);
        resume.push(f.resume);
        ack.push(f.ack);
        total.push(f.total);
    }
    let label = format!("rtt ({background_paused} other runs paused)");
    let floor = floor.summary();
    let resume_s = resume.summary();
    let total_s = total.summary();
    println!("{label}");
    println!("  floor (between)  {floor}");
    println!("  first chunk      {}", ttfc.summary());
    println!("  confirm→resume   {resume_s}");
    println!("  reply ack        {}", ack.summary());
    println!("  whole flow       {total_s}");
    println!(
        "  ratios to the floor p50 ({} µs): resume {:.2}x, flow {:.2}x",
        floor.p50,
        resume_s.p50 as f64 / floor.p50.max(1) as f64,
        total_s.p50 as f64 / floor.p50.max(1) as f64
    );
    if let Some(held) = held {
        release(addr, held, 64, "bg", Pause::PLAN).await?;
    }
    Ok(())
}

/// What a held run pauses on, and how it is released.
#[derive(Clone, Copy)]
struct Pause {
    message: &'static str,
    kind: Kind,
    /// The reply that releases it, and the final chunk that follows.
    release: &'static str,
    released: Kind,
    label: &'static str,
}

impl Pause {
    const PLAN: Pause = Pause {
        message: "hold this",
        kind: Kind::ConfirmationRequest,
        release: "confirm",
        released: Kind::Completion,
        label: "plan",
    };
    const QUESTION: Pause = Pause {
        message: QUESTION_MESSAGE,
        kind: Kind::InputRequest,
        release: "cancel",
        released: Kind::Cancelled,
        label: "question",
    };

    fn of(question: bool) -> Pause {
        if question {
            Pause::QUESTION
        } else {
            Pause::PLAN
        }
    }
}

/// Paused runs, each with its stream connection and confirmation id.
type Held = Vec<(usize, Conn, [u8; 36])>;

async fn open_paused(
    addr: &str,
    k: usize,
    concurrency: usize,
    prefix: &'static str,
    pause: Pause,
) -> io::Result<Held> {
    open_with(addr, k, concurrency, prefix, pause, |i, conn, id| {
        (i, conn, id)
    })
    .await
}

/// Opens `k` runs to their pause, `concurrency` at a time; `keep` says what
/// is kept of each (its connection, or only its confirmation id).
async fn open_with<T: Send + 'static>(
    addr: &str,
    k: usize,
    concurrency: usize,
    prefix: &'static str,
    pause: Pause,
    keep: fn(usize, Conn, [u8; 36]) -> T,
) -> io::Result<Vec<T>> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency.min(k) {
        let (next, addr) = (next.clone(), addr.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut kept = Vec::new();
            let mut buf = Vec::with_capacity(128);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= k {
                    return Ok::<_, io::Error>(kept);
                }
                let mut conn = Conn::connect(&addr).await?;
                session_json(&mut buf, prefix, i, pause.message);
                if conn.post_chat(&buf).await? != 200 {
                    return Err(err("open not 200"));
                }
                let id = loop {
                    let event = conn
                        .next_event()
                        .await?
                        .ok_or_else(|| err("ended before pause"))?;
                    if event.kind == pause.kind {
                        break event.confirmation_id.ok_or_else(|| err("no id"))?;
                    }
                };
                kept.push(keep(i, conn, id));
            }
        }));
    }
    let mut all = Vec::with_capacity(k);
    for task in tasks {
        all.extend(task.await.map_err(|e| err(&e.to_string()))??);
    }
    Ok(all)
}

/// Confirms every held run and reads each stream to completion.
/// Returns the number of failures.
async fn release(
    addr: &str,
    held: Held,
    concurrency: usize,
    prefix: &'static str,
    pause: Pause,
) -> io::Result<usize> {
    let queue = Arc::new(std::sync::Mutex::new(held));
    let failures = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (queue, failures, addr) = (queue.clone(), failures.clone(), addr.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut reply = Conn::connect(&addr).await?;
            let mut buf = Vec::with_capacity(160);
            let mut streams = Vec::new();
            loop {
                let Some((i, conn, id)) = queue.lock().unwrap().pop() else {
                    break;
                };
                reply_with(&mut buf, pause.release, prefix, i, &id);
                let ok = reply.post_chat(&buf).await? == 200;
                reply.read_to_end().await?;
                if !ok {
                    failures.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                streams.push(conn);
            }
            for mut conn in streams {
                match conn.read_to_end().await {
                    Ok((_, last)) if last.kind == pause.released => {}
                    _ => {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Ok::<_, io::Error>(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| err(&e.to_string()))??;
    }
    Ok(failures.load(Ordering::Relaxed))
}

/// Opens `k` runs to their pause, dropping each connection as soon as its
/// run has paused (never more than `concurrency` sockets open); returns
/// each run's number and confirmation id.
async fn open_detached(
    addr: &str,
    k: usize,
    concurrency: usize,
    prefix: &'static str,
    pause: Pause,
) -> io::Result<Vec<(usize, [u8; 36])>> {
    open_with(addr, k, concurrency, prefix, pause, |i, conn, id| {
        drop(conn);
        (i, id)
    })
    .await
}

/// `paused --detach`: what a paused run whose client went away costs.
async fn detached(
    addr: &str,
    k: usize,
    server_pid: Option<u32>,
    concurrency: usize,
    pause: Pause,
) -> io::Result<()> {
    // Until the server notices a client gone (at its next keep-alive write
    // or the one after) it holds the connection and its buffers, and the
    // allocator keeps the peak it reached: start the server with a short
    // `--keep-alive` (50ms) so that few connections wait to be noticed.
    let before = server_pid.and_then(rss_kib);
    let start = Instant::now();
    let opened = open_detached(addr, k, concurrency, "detached", pause).await?;
    let open = start.elapsed();
    // Time for the server to notice the last clients gone and let go.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = server_pid.and_then(rss_kib);
    let per_run = per_run(before, during, k);
    // Every detached run still waits for its decision: a reply decides it.
    let start = Instant::now();
    let failures = confirm_detached(addr, opened, concurrency, "detached", pause).await?;
    let confirm = start.elapsed();
    println!(
        "detached {} k={k:<6} open {:>7.1} ms  released by reply {:>7.1} ms  failures {failures}  RSS before {} KiB, detached {} KiB  => {per_run}",
        pause.label,
        open.as_secs_f64() * 1e3,
        confirm.as_secs_f64() * 1e3,
        before.map_or("?".into(), |v| v.to_string()),
        during.map_or("?".into(), |v| v.to_string()),
    );
    Ok(())
}

/// Confirms each of `opened` by a reply alone; returns how many were not
/// answered 200 (a run that no longer waited).
async fn confirm_detached(
    addr: &str,
    opened: Vec<(usize, [u8; 36])>,
    concurrency: usize,
    prefix: &'static str,
    pause: Pause,
) -> io::Result<usize> {
    let queue = Arc::new(std::sync::Mutex::new(opened));
    let failures = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (queue, failures, addr) = (queue.clone(), failures.clone(), addr.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut reply = Conn::connect(&addr).await?;
            let mut buf = Vec::with_capacity(160);
            loop {
                let Some((i, id)) = queue.lock().unwrap().pop() else {
                    return Ok::<_, io::Error>(());
                };
                reply_with(&mut buf, pause.release, prefix, i, &id);
                if reply.post_chat(&buf).await? != 200 {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
                reply.read_to_end().await?;
            }
        }));
    }
    for task in tasks {
        task.await.map_err(|e| err(&e.to_string()))??;
    }
    Ok(failures.load(Ordering::Relaxed))
}

/// The server's RSS growth per run, from two samples.
fn per_run(before: Option<u64>, during: Option<u64>, k: usize) -> String {
    match (before, during) {
        (Some(b), Some(d)) => format!("{:.2} KiB/run", (d.saturating_sub(b)) as f64 / k as f64),
        _ => "n/a (pass --server-pid)".to_owned(),
    }
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

async fn paused(
    addr: &str,
    k: usize,
    server_pid: Option<u32>,
    concurrency: usize,
    hold_only: bool,
    pause: Pause,
) -> io::Result<()> {
    let before = server_pid.and_then(rss_kib);
    let start = Instant::now();
    let held = open_paused(addr, k, concurrency, "paused", pause).await?;
    let open = start.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during = server_pid.and_then(rss_kib);
    let per_run = per_run(before, during, k);
    if hold_only {
        println!(
            "held k={k:<6} open {:>7.1} ms  RSS before {} KiB, held {} KiB  => {per_run}",
            open.as_secs_f64() * 1e3,
            before.map_or("?".into(), |v| v.to_string()),
            during.map_or("?".into(), |v| v.to_string()),
        );
        return Ok(());
    }
    let start = Instant::now();
    let failures = release(addr, held, concurrency, "paused", pause).await?;
    let resume = start.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = server_pid.and_then(rss_kib);
    println!(
        "paused {} k={k:<6} open {:>7.1} ms  release {:>7.1} ms  failures {failures}  RSS before {} KiB, paused {} KiB, after {} KiB  => {per_run}",
        pause.label,
        open.as_secs_f64() * 1e3,
        resume.as_secs_f64() * 1e3,
        before.map_or("?".into(), |v| v.to_string()),
        during.map_or("?".into(), |v| v.to_string()),
        after.map_or("?".into(), |v| v.to_string()),
    );
    Ok(())
}

async fn throughput(addr: &str, clients: usize, seconds: u64) -> io::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (stop, addr) = (stop.clone(), addr.to_owned());
        tasks.push(tokio::spawn(async move {
            let (mut stream, mut reply) =
                (Conn::connect(&addr).await?, Conn::connect(&addr).await?);
            let mut buf = Vec::with_capacity(256);
            let mut samples = Samples::with_capacity(1 << 16);
            let prefix = format!("tp{c}-");
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let f = flow(&mut stream, &mut reply, &mut buf, &prefix, i).await?;
                samples.push(f.total);
                i += 1;
            }
            Ok::<_, io::Error>(samples)
        }));
    }
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Samples::default();
    for task in tasks {
        all.extend(task.await.map_err(|e| err(&e.to_string()))??);
    }
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "throughput  {clients} clients {seconds}s: {:.0} flows/s  flow {}",
        all.len() as f64 / elapsed,
        all.summary()
    );
    Ok(())
}

async fn chat(addr: &str, clients: usize, seconds: u64) -> io::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (stop, addr) = (stop.clone(), addr.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::connect(&addr).await?;
            let mut buf = Vec::with_capacity(128);
            let prefix = format!("chat{c}-");
            let (mut chunks, mut answers) = (0usize, 0usize);
            while !stop.load(Ordering::Relaxed) {
                session_json(&mut buf, &prefix, answers, "what can you do?");
                if conn.post_chat(&buf).await? != 200 {
                    return Err(err("chat not 200"));
                }
                let (n, last) = conn.read_to_end().await?;
                if last.kind != Kind::Completion {
                    return Err(err("answer did not complete"));
                }
                chunks += n;
                answers += 1;
            }
            Ok::<_, io::Error>((chunks, answers))
        }));
    }
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut chunks, mut answers) = (0, 0);
    for task in tasks {
        let (c, a) = task.await.map_err(|e| err(&e.to_string()))??;
        chunks += c;
        answers += a;
    }
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "chat        {clients} clients {seconds}s: {:.0} chunks/s, {:.0} answers/s",
        chunks as f64 / elapsed,
        answers as f64 / elapsed
    );
    Ok(())
}

/// Sequential flows whose one step calls a declared tool: confirm→output is
/// from writing the confirm to reading the step's `tool_output` (the reply,
/// the wake-up, the audit records if any, the process, its output); direct
/// is spawning the command with the same stdin and waiting for it.
/// What `tool_calls` compares chatgate's calls against.
enum Floor {
    /// The command, spawned with the same stdin.
    Command(Vec<String>),
    /// The MCP server's command and the tool's name on it, called by a
    /// minimal client.
    Mcp(Vec<String>, String),
}

/// Sequential flows, alternately a `trivial` call a rule allows (no
/// pause: start→completion) and one asked (start→pause→confirm→completion).
async fn allowed(addr: &str, n: usize, asked_only: bool) -> io::Result<()> {
    let (mut stream, mut reply) = (Conn::connect(addr).await?, Conn::connect(addr).await?);
    let mut buf = Vec::with_capacity(256);
    let (mut free, mut asked) = (Samples::with_capacity(n), Samples::with_capacity(n));
    for i in 0..n + 50 {
        let start = Instant::now();
        if !asked_only {
            session_json(&mut buf, "allowed", i, "trivial allowed call");
            if stream.post_chat(&buf).await? != 200 {
                return Err(err("start not 200"));
            }
            let (_, last) = stream.read_to_end().await?;
            if last.kind != Kind::Completion {
                return Err(err(
                    "the allowed call did not complete (start with --tools bench/rules.toml)",
                ));
            }
        }
        let took = start.elapsed();
        session_json(&mut buf, "asked", i, "trivial asked call");
        let start = Instant::now();
        if stream.post_chat(&buf).await? != 200 {
            return Err(err("start not 200"));
        }
        let (id, _) = pause_of(&mut stream, Kind::ConfirmationRequest, start).await?;
        reply_json(&mut buf, "asked", i, &id);
        decide(&mut stream, &mut reply, &buf).await?;
        let (_, last) = stream.read_to_end().await?;
        if last.kind != Kind::Completion {
            return Err(err("the asked call did not complete"));
        }
        if i >= 50 {
            free.push(took);
            asked.push(start.elapsed());
        }
    }
    let (free, asked) = (free.summary(), asked.summary());
    if asked_only {
        println!("allowed     asked and confirmed  {asked}");
        return Ok(());
    }
    println!("allowed     by rule, no pause    {free}");
    println!("            asked and confirmed  {asked}");
    println!(
        "            an allowed call costs {:.2}x of an asked one (p50)",
        free.p50 as f64 / asked.p50.max(1) as f64
    );
    Ok(())
}

async fn tool_calls(addr: &str, n: usize, tool: &str, args: &str, floor: Floor) -> io::Result<()> {
    let (mut stream, mut reply) = (Conn::connect(addr).await?, Conn::connect(addr).await?);
    let mut buf = Vec::with_capacity(256);
    // Inside a JSON string.
    let message = format!("{tool} {}", args.replace('\\', "\\\\").replace('"', "\\\""));
    let mut confirm_to_output = Samples::with_capacity(n);
    let mut flows = Samples::with_capacity(n);
    for i in 0..n + 20 {
        session_json(&mut buf, "tool", i, &message);
        let began = Instant::now();
        if stream.post_chat(&buf).await? != 200 {
            return Err(err("start not 200"));
        }
        let id = loop {
            let event = stream
                .next_event()
                .await?
                .ok_or_else(|| err("ended before pause"))?;
            if event.kind == Kind::ConfirmationRequest {
                break event
                    .confirmation_id
                    .ok_or_else(|| err("no confirmation id"))?;
            }
            if event.finished {
                return Err(err("finished before pause (is the tool declared?)"));
            }
        };
        reply_json(&mut buf, "tool", i, &id);
        let sent = Instant::now();
        if reply.post_chat(&buf).await? != 200 {
            return Err(err("reply not 200"));
        }
        reply.read_to_end().await?;
        loop {
            let event = stream
                .next_event()
                .await?
                .ok_or_else(|| err("ended before the output"))?;
            if event.kind == Kind::ToolOutput {
                break;
            }
            if event.finished {
                return Err(err("finished without a tool_output"));
            }
        }
        if i >= 20 {
            confirm_to_output.push(sent.elapsed());
        }
        let (_, last) = stream.read_to_end().await?;
        if last.kind != Kind::Completion {
            return Err(err("the tool call did not complete (did it fail?)"));
        }
        if i >= 20 {
            flows.push(began.elapsed());
        }
    }
    println!("tool        whole flow           {}", flows.summary());
    let direct = match floor {
        Floor::Command(direct) => direct,
        Floor::Mcp(server, name) => {
            let mut own = mcp::direct_calls(&server, &name, args, n, 20).await?;
            let via = confirm_to_output.summary();
            let own = own.summary();
            println!("tool        confirm→output       {via}");
            println!("            MCP call directly    {own}");
            println!(
                "            chatgate adds p50 {} µs over the MCP call ({:.2}x)",
                via.p50.saturating_sub(own.p50),
                via.p50 as f64 / own.p50.max(1) as f64
            );
            return Ok(());
        }
    };
    let mut direct_samples = tokio::task::spawn_blocking({
        let direct = direct.to_vec();
        move || -> io::Result<Samples> {
            use std::io::Write;
            let mut samples = Samples::with_capacity(n);
            for i in 0..n + 20 {
                let start = Instant::now();
                let mut child = std::process::Command::new(&direct[0])
                    .args(&direct[1..])
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .spawn()?;
                if let Some(mut stdin) = child.stdin.take() {
                    stdin.write_all(br#"{"step":"trivial call"}"#)?;
                }
                child.wait_with_output()?;
                if i >= 20 {
                    samples.push(start.elapsed());
                }
            }
            Ok(samples)
        }
    })
    .await
    .map_err(|e| err(&e.to_string()))??;
    let via = confirm_to_output.summary();
    let own = direct_samples.summary();
    println!("tool        confirm→output       {via}");
    println!("            command directly     {own}");
    println!(
        "            chatgate adds p50 {} µs over the command ({:.2}x)",
        via.p50.saturating_sub(own.p50),
        via.p50 as f64 / own.p50.max(1) as f64
    );
    Ok(())
}
