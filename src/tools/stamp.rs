//! What a call carries from its approval to the tool: its signed receipt
//! (#43) and its idempotency key (#44), each where its executor puts such
//! things (a command's environment, an http request's headers, an MCP
//! call's `_meta`). docs/tools.md, "Receipts" and "Exactly once".

/// A command finds its approval's signed receipt here.
pub const RECEIPT_ENV: &str = "CHATGATE_RECEIPT";
/// A command finds its idempotency key here.
pub const IDEMPOTENCY_ENV: &str = "CHATGATE_IDEMPOTENCY_KEY";
/// The http request header that carries the call's signed receipt.
pub const RECEIPT_HEADER: &str = "chatgate-receipt";
/// The http request header that carries the call's idempotency key.
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";
/// The `_meta` key of an MCP call that carries its signed receipt.
pub const RECEIPT_META: &str = "io.chatgate/receipt";
/// The `_meta` key of an MCP call that carries its idempotency key.
pub const IDEMPOTENCY_META: &str = "io.chatgate/idempotencyKey";

/// A call's receipt and idempotency key, either absent (a preview, a call
/// nobody had to clear).
#[derive(Debug, Clone, Copy, Default)]
pub struct Stamp<'a> {
    pub receipt: Option<&'a str>,
    pub idempotency_key: Option<&'a str>,
}

impl Stamp<'_> {
    /// Nothing to carry.
    pub const NONE: Stamp<'static> = Stamp {
        receipt: None,
        idempotency_key: None,
    };

    /// The environment variables a command gets.
    pub fn env(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            (RECEIPT_ENV, self.receipt),
            (IDEMPOTENCY_ENV, self.idempotency_key),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)))
    }

    /// The request headers an http call gets.
    pub fn headers(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            (RECEIPT_HEADER, self.receipt),
            (IDEMPOTENCY_HEADER, self.idempotency_key),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)))
    }

    /// The `_meta` entries an MCP call gets.
    pub fn meta(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            (RECEIPT_META, self.receipt),
            (IDEMPOTENCY_META, self.idempotency_key),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)))
    }
}
