//! A minimal HTTP/1.1 client for one persistent connection: just enough to
//! send the chat requests, read a response head, de-chunk the body and split
//! it into SSE events. Buffers are reused across requests; reading an event
//! allocates nothing.

use std::io;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub struct Conn {
    stream: TcpStream,
    /// Raw bytes from the socket, not yet consumed.
    raw: Vec<u8>,
    raw_pos: usize,
    /// De-chunked body bytes, not yet split into events.
    body: Vec<u8>,
    body_pos: usize,
    state: BodyState,
    request: Vec<u8>,
    /// `Authorization: Bearer KEY\r\n`, when the requests carry a key.
    authorization: Vec<u8>,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum BodyState {
    /// Bytes left of a Content-Length body.
    Length(usize),
    /// Inside a chunked body: bytes left of the current chunk (0: read a size line).
    Chunked(usize),
    Done,
}

/// What the bench needs of one SSE event.
#[derive(Debug, Default, Clone, Copy)]
pub struct Event {
    pub comment: bool,
    pub finished: bool,
    pub kind: Kind,
    /// The confirmation id of a `confirmation_request` or an `input_request`.
    pub confirmation_id: Option<[u8; 36]>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    #[default]
    Other,
    ConfirmationRequest,
    InputRequest,
    ConfirmationReceived,
    Completion,
    Content,
    Cancelled,
    Error,
    ToolOutput,
}

impl Conn {
    pub async fn connect(addr: &str) -> io::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            raw: Vec::with_capacity(4096),
            raw_pos: 0,
            body: Vec::with_capacity(4096),
            body_pos: 0,
            state: BodyState::Done,
            request: Vec::with_capacity(512),
            authorization: Vec::new(),
        })
    }

    /// Every chat request of this connection carries `key` as a bearer.
    pub fn bearer(mut self, key: &str) -> Conn {
        self.authorization = format!("Authorization: Bearer {key}\r\n").into_bytes();
        self
    }

    /// Sends `POST /api/v1/chat/stream` with a JSON body and reads the head.
    /// Returns the status.
    pub async fn post_chat(&mut self, json: &[u8]) -> io::Result<u16> {
        self.post_to(b"/api/v1/chat/stream", json).await
    }

    /// Sends `POST path` with a JSON body, reads the response head, returns
    /// its status.
    pub async fn post_to(&mut self, path: &[u8], json: &[u8]) -> io::Result<u16> {
        self.post_with(path, json, None).await
    }

    /// A re-attach: `POST /api/v1/chat/stream` with `Last-Event-ID:
    /// last_seen`; reads the head, returns the status.
    pub async fn reattach(&mut self, json: &[u8], last_seen: u64) -> io::Result<u16> {
        self.post_with(b"/api/v1/chat/stream", json, Some(last_seen))
            .await
    }

    async fn post_with(
        &mut self,
        path: &[u8],
        json: &[u8],
        last_seen: Option<u64>,
    ) -> io::Result<u16> {
        self.request.clear();
        self.request.extend_from_slice(b"POST ");
        self.request.extend_from_slice(path);
        self.request.extend_from_slice(
            b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n",
        );
        if let Some(seen) = last_seen {
            self.request.extend_from_slice(b"Last-Event-ID: ");
            push_usize(&mut self.request, seen as usize);
            self.request.extend_from_slice(b"\r\n");
        }
        self.request.extend_from_slice(&self.authorization);
        self.request.extend_from_slice(b"Content-Length: ");
        push_usize(&mut self.request, json.len());
        self.request.extend_from_slice(b"\r\n\r\n");
        self.request.extend_from_slice(json);
        self.stream.write_all(&self.request).await?;
        self.read_head().await
    }

    /// Sends `GET path`, reads the whole response, returns the status.
    pub async fn get(&mut self, path: &str) -> io::Result<u16> {
        let status = self.send_get(path).await?;
        while self.fill_body().await? {}
        self.body.clear();
        self.body_pos = 0;
        Ok(status)
    }

    /// Sends `GET path`, reads the whole response into `out` (cleared
    /// first), returns the status.
    pub async fn get_body(&mut self, path: &str, out: &mut Vec<u8>) -> io::Result<u16> {
        let status = self.send_get(path).await?;
        self.read_body(out).await?;
        Ok(status)
    }

    /// Sends `GET path` and reads the response's head: its status.
    async fn send_get(&mut self, path: &str) -> io::Result<u16> {
        self.request.clear();
        self.request.extend_from_slice(b"GET ");
        self.request.extend_from_slice(path.as_bytes());
        self.request
            .extend_from_slice(b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        self.stream.write_all(&self.request).await?;
        self.read_head().await
    }

    /// The whole body of the current response, into `out` (cleared first).
    pub async fn read_body(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        while self.fill_body().await? {}
        out.clear();
        out.extend_from_slice(&self.body[self.body_pos..]);
        self.body.clear();
        self.body_pos = 0;
        Ok(())
    }

    /// The next SSE event of the current response; `None` at its end.
    pub async fn next_event(&mut self) -> io::Result<Option<Event>> {
        loop {
            let unread = &self.body[self.body_pos..];
            if let Some(end) = find(unread, b"\n\n") {
                let event = parse_event(&unread[..end]);
                self.body_pos += end + 2;
                if self.body_pos == self.body.len() {
                    self.body.clear();
                    self.body_pos = 0;
                }
                return Ok(Some(event));
            }
            if !self.fill_body().await? {
                return Ok(None);
            }
        }
    }

    /// Reads what is left of the current response (after its final event).
    pub async fn drain(&mut self) -> io::Result<()> {
        while self.fill_body().await? {}
        self.body.clear();
        self.body_pos = 0;
        Ok(())
    }

    /// Reads events until one that is `finished`; returns how many were read.
    pub async fn read_to_end(&mut self) -> io::Result<(usize, Event)> {
        let mut count = 0;
        while let Some(event) = self.next_event().await? {
            if event.comment {
                continue;
            }
            count += 1;
            if event.finished {
                // Drain the chunked terminator so the connection can be reused.
                while self.fill_body().await? {}
                return Ok((count, event));
            }
        }
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "stream ended without a final chunk",
        ))
    }

    async fn read_more(&mut self) -> io::Result<()> {
        if self.raw_pos == self.raw.len() {
            self.raw.clear();
            self.raw_pos = 0;
        } else if self.raw_pos > 0 && self.raw.len() == self.raw.capacity() {
            self.raw.drain(..self.raw_pos);
            self.raw_pos = 0;
        }
        if self.raw.capacity() - self.raw.len() < 1024 {
            self.raw.reserve(4096);
        }
        let n = self.stream.read_buf(&mut self.raw).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        Ok(())
    }

    async fn read_head(&mut self) -> io::Result<u16> {
        let end = loop {
            if let Some(end) = find(&self.raw[self.raw_pos..], b"\r\n\r\n") {
                break self.raw_pos + end;
            }
            self.read_more().await?;
        };
        let head = &self.raw[self.raw_pos..end];
        let status = head
            .get(9..12)
            .and_then(|s| std::str::from_utf8(s).ok())
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad status line"))?;
        let mut state = BodyState::Length(0);
        for line in head.split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(v) = strip_prefix_ci(line, b"content-length:") {
                let len = std::str::from_utf8(v)
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                state = BodyState::Length(len);
            } else if let Some(v) = strip_prefix_ci(line, b"transfer-encoding:") {
                if v.windows(7).any(|w| w.eq_ignore_ascii_case(b"chunked")) {
                    state = BodyState::Chunked(0);
                }
            }
        }
        self.raw_pos = end + 4;
        self.state = match state {
            BodyState::Length(0) => BodyState::Done,
            other => other,
        };
        Ok(status)
    }

    /// Moves body bytes from `raw` into `body`, reading the socket if needed.
    /// Returns false once the body is complete.
    async fn fill_body(&mut self) -> io::Result<bool> {
        loop {
            match self.state {
                BodyState::Done => return Ok(false),
                BodyState::Length(left) => {
                    if self.raw_pos == self.raw.len() {
                        self.read_more().await?;
                    }
                    let take = left.min(self.raw.len() - self.raw_pos);
                    self.body
                        .extend_from_slice(&self.raw[self.raw_pos..self.raw_pos + take]);
                    self.raw_pos += take;
                    self.state = if left == take {
                        BodyState::Done
                    } else {
                        BodyState::Length(left - take)
                    };
                    return Ok(true);
                }
                BodyState::Chunked(0) => {
                    // A size line: "<hex>\r\n" (after the previous chunk's "\r\n").
                    let unread = &self.raw[self.raw_pos..];
                    let skip = if unread.starts_with(b"\r\n") { 2 } else { 0 };
                    let Some(end) = find(&unread[skip..], b"\r\n") else {
                        self.read_more().await?;
                        continue;
                    };
                    let size_line = &unread[skip..skip + end];
                    let size = usize::from_str_radix(
                        std::str::from_utf8(size_line)
                            .unwrap_or("")
                            .split(';')
                            .next()
                            .unwrap_or("")
                            .trim(),
                        16,
                    )
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad chunk size"))?;
                    if size == 0 {
                        // Last chunk: "0\r\n\r\n".
                        let after = skip + end + 2;
                        while self.raw.len() - self.raw_pos < after + 2 {
                            self.read_more().await?;
                        }
                        self.raw_pos += after + 2;
                        self.state = BodyState::Done;
                        return Ok(false);
                    }
                    self.raw_pos += skip + end + 2;
                    self.state = BodyState::Chunked(size);
                }
                BodyState::Chunked(left) => {
                    if self.raw_pos == self.raw.len() {
                        self.read_more().await?;
                    }
                    let take = left.min(self.raw.len() - self.raw_pos);
                    self.body
                        .extend_from_slice(&self.raw[self.raw_pos..self.raw_pos + take]);
                    self.raw_pos += take;
                    self.state = BodyState::Chunked(left - take);
                    if left - take == 0 {
                        // Need the trailing CRLF before the next size line.
                        while self.raw.len() - self.raw_pos < 2 {
                            self.read_more().await?;
                        }
                        self.raw_pos += 2;
                    }
                    return Ok(true);
                }
            }
        }
    }
}

fn parse_event(event: &[u8]) -> Event {
    if event.first() == Some(&b':') {
        return Event {
            comment: true,
            ..Event::default()
        };
    }
    let kind = match between(event, b"\"chunk_type\":\"", b'"') {
        Some(b"confirmation_request") => Kind::ConfirmationRequest,
        Some(b"input_request") => Kind::InputRequest,
        Some(b"confirmation_received") => Kind::ConfirmationReceived,
        Some(b"completion") => Kind::Completion,
        Some(b"content") => Kind::Content,
        Some(b"cancelled") => Kind::Cancelled,
        Some(b"error") => Kind::Error,
        Some(b"tool_output") => Kind::ToolOutput,
        _ => Kind::Other,
    };
    let confirmation_id = if matches!(kind, Kind::ConfirmationRequest | Kind::InputRequest) {
        between(event, b"\"confirmation_id\":\"", b'"').and_then(|id| id.try_into().ok())
    } else {
        None
    };
    Event {
        comment: false,
        finished: find(event, b"\"finished\":true").is_some(),
        kind,
        confirmation_id,
    }
}

pub fn between<'a>(hay: &'a [u8], start: &[u8], end: u8) -> Option<&'a [u8]> {
    let from = find(hay, start)? + start.len();
    let len = hay[from..].iter().position(|&b| b == end)?;
    Some(&hay[from..from + len])
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn strip_prefix_ci<'a>(line: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    (line.len() >= prefix.len() && line[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &line[prefix.len()..])
}

fn push_usize(out: &mut Vec<u8>, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}
