//! Approval mail (`--smtp`) through a real SMTP server (aiosmtpd, from the
//! venv `tests/mcp/setup.sh` makes; run with `-- --ignored`): each
//! eligible approver with an `email=` gets one mail with their own link,
//! a refused attempt is retried with the same Message-ID, an escalation
//! mails the new group's members, and a mail's link decides.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use chatgate::protocol::ChunkType;
use secrecy::SecretString;

use crate::approvers::paused;
use crate::helpers::TestApp;
use crate::tools::{app_with_tools, Workdir};

const KEYS: &str = "\
agent-key-000001 label=ci-bot
approver lead-key-000001 label=lead-1 groups=leads email=lead1@example.com
approver lead-key-000002 label=junior max_risk=low email=junior@example.com
approver oncall-key-0001 label=oncall-1 groups=oncall email=oncall1@example.com
";

/// `restart` (medium risk) is decided by the leads; after 2s by oncall too.
const TOOLS: &str = r#"
[[tool]]
name = "restart"
description = "Restart a service"
risk = "medium"
approvers = "leads"
remind_after = "1s"
escalate_after = "2s"
escalate_to = "oncall"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"#;

/// A running aiosmtpd that refuses its first `fails` messages.
struct Smtp {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Smtp {
    fn start(dir: &Path, fails: u32) -> Smtp {
        let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/.venv/bin/python");
        assert!(
            python.exists(),
            "run tests/mcp/setup.sh first (it installs aiosmtpd)"
        );
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mail/smtp_server.py");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let out = dir.join("mail");
        std::fs::create_dir_all(&out).unwrap();
        let mut child = Command::new(python)
            .arg(script)
            .arg(port.to_string())
            .arg(&out)
            .arg(fails.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
        Smtp {
            child,
            port,
            dir: out,
        }
    }

    /// The mails received so far: recipients and text, in order.
    fn received(&self) -> Vec<(Vec<String>, String)> {
        let mut names: Vec<_> = std::fs::read_dir(&self.dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "eml"))
            .collect();
        names.sort();
        names
            .into_iter()
            .map(|eml| {
                let rcpt = std::fs::read_to_string(eml.with_extension("rcpt")).unwrap();
                let to: Vec<String> = serde_json::from_str(&rcpt).unwrap();
                (to, std::fs::read_to_string(&eml).unwrap())
            })
            .collect()
    }

    async fn wait(&self, n: usize) -> Vec<(Vec<String>, String)> {
        for _ in 0..750 {
            let got = self.received();
            if got.len() >= n {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{} of {n} mails arrived", self.received().len());
    }

    fn attempts(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("attempts"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Smtp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn app(dir: &Workdir, smtp: &Smtp) -> TestApp {
    let keys = dir.path("keys.txt");
    std::fs::write(&keys, KEYS).unwrap();
    let url = format!("smtp://127.0.0.1:{}", smtp.port);
    app_with_tools(dir, TOOLS, move |s| {
        s.notify.public_url = Some("https://gate.example".to_owned());
        s.notify.link_secret = Some(SecretString::from(
            "a-link-secret-for-the-mail-tests-01".to_owned(),
        ));
        s.notify.smtp = Some(SecretString::from(url));
        s.notify.mail_from = Some("chatgate <gate@example.com>".to_owned());
        s.server.api_keys_file = Some(keys);
    })
    .await
}

/// The decision link in a mail's text part (quoted-printable undone).
fn link_in(mail: &str) -> String {
    let mail = mail
        .replace("=\r\n", "")
        .replace("=\n", "")
        .replace("=3D", "=");
    let at = mail.find("https://gate.example/d/").expect("a link");
    mail[at..]
        .split(|c: char| c.is_whitespace() || c == '<' || c == '"')
        .next()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs aiosmtpd: tests/mcp/setup.sh"]
async fn each_eligible_approver_is_mailed_their_link_retried_and_escalated() {
    let dir = Workdir::new();
    // The first attempt is refused (451): the outbox tries again.
    let smtp = Smtp::start(&dir.path("."), 1);
    let app = app(&dir, &smtp).await;
    let (mut stream, _) = paused(&app, "agent-key-000001", "ml", "restart api").await;

    // The leads' member only: junior's max_risk is low, oncall not yet.
    let mails = smtp.wait(1).await;
    assert_eq!(mails[0].0, ["lead1@example.com"]);
    let text = &mails[0].1;
    assert!(
        text.contains("Subject: [chatgate] Approval needed"),
        "{text}"
    );
    assert!(
        text.contains("1. restart (medium risk): restart api"),
        "{text}"
    );
    // The subject names the tool and the session; the mail says who decides.
    assert!(
        text.contains("Approval needed: restart in session ml:"),
        "{text}"
    );
    assert!(text.contains("Needs one approval of leads"), "{text}");
    assert!(text.contains("Content-Type: text/html"), "{text}");
    let attempts = smtp.attempts();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(attempts[0], attempts[1], "a retry is the same message");
    assert!(attempts[0].contains("lead-1@chatgate"), "{attempts:?}");

    // The reminder mails the leads' member again (not only a webhook), and
    // the escalation oncall's member (in whichever order they arrive: each
    // address has its own queue).
    let all = smtp.wait(3).await;
    let reminder = all
        .iter()
        .find(|(_, text)| text.contains("Reminder"))
        .expect("a reminder mail");
    assert_eq!(reminder.0, ["lead1@example.com"]);
    assert!(
        reminder
            .1
            .contains("Subject: [chatgate] Reminder, approval needed: restart"),
        "{}",
        reminder.1
    );
    assert!(
        reminder
            .1
            .contains("Reminder: nobody has decided this yet."),
        "{}",
        reminder.1
    );
    let escalation = all
        .iter()
        .find(|(to, _)| to == &["oncall1@example.com"])
        .expect("an escalation mail")
        .clone();
    let mails = [all[0].clone(), escalation];
    assert_eq!(mails[1].0, ["oncall1@example.com"]);
    assert!(mails[1].1.contains("Escalated to oncall"), "{}", mails[1].1);
    // What waits, as the first mail said it: the summary, tasks, risk and
    // expiry (not an empty "a pause waits").
    assert!(
        mails[1].1.contains("1. restart (medium risk): restart api"),
        "{}",
        mails[1].1
    );
    assert!(
        mails[1]
            .1
            .contains("from ci-bot, session ml, medium risk, expires 20"),
        "{}",
        mails[1].1
    );

    // lead-1's link decides as lead-1.
    let link = link_in(&mails[0].1).replace("https://gate.example", &app.address);
    let response = app
        .client
        .post(&link)
        .form(&[("action", "confirm")])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response.headers()["x-chatgate-outcome"].to_str().unwrap(),
        "Confirmed by lead-1"
    );
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(smtp.received().len(), 3, "one mail per person and event");
}
