//! Signed receipts (#43): every decision that lets a call run yields a
//! compact JWS (RFC 7515, `alg: EdDSA`, Ed25519) the tool receives, saying
//! who approved exactly which call, through which door, when.
//!
//! The key: `--receipt-key PATH`, an Ed25519 private key in PKCS#8 PEM
//! (replicas share the file); more `--receipt-key`s are older keys (private,
//! or public SPKI PEM) published so that their receipts stay verifiable
//! during a rotation. Without one, a key is made at start: its receipts
//! verify only against this process's JWKS. `GET /.well-known/jwks.json`
//! publishes the public keys; each key's `kid` is its RFC 7638 thumbprint,
//! so replicas sharing a file name it alike.
//!
//! Keys are read and made, and receipts signed, by `ed25519-dalek`; this
//! file only lays out the JWS Compact Serialization around its signature
//! (RFC 7515 §7.1: base64url of the header, of the payload, of the
//! signature, joined by dots). No cryptography of our own. `jsonwebtoken`
//! signs the same way, but reads its PKCS#8 key again for every token
//! (21 of its 44 µs here); the tests verify these receipts with it and
//! with PyJWT.

use std::path::{Path, PathBuf};

use base64::Engine;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey};
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use serde::Serialize;
use serde_json::{json, Value};

use crate::audit::sha256_hex;
pub use crate::protocol::Via;

/// The task a receipt is for: which call, exactly.
#[derive(Debug, Clone, Serialize)]
pub struct TaskClaim {
    pub index: usize,
    pub tool: String,
    /// [`call_digest`] of the call's tool and arguments as they run.
    pub args_digest: String,
    /// The digest of the preview the approval was shown; `null` for a
    /// task without a preview.
    pub preview_digest: Option<String>,
}

/// A receipt's payload, as pinned by #43.
#[derive(Debug, Clone, Serialize)]
pub struct Receipt {
    pub iss: String,
    pub confirmation_id: Option<String>,
    pub session_id: String,
    pub round: u32,
    pub task: TaskClaim,
    pub approved_by: Vec<String>,
    pub via: Via,
    /// RFC 3339, UTC, milliseconds.
    pub decided_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

/// JSON as a digest reads it: keys sorted at every level, no whitespace,
/// strings as serde_json writes them (non-ASCII as UTF-8).
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::from(key.as_str()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The lower-case hex SHA-256 of the canonical JSON of `{"tool", "args"}`:
/// a receipt's `args_digest`.
pub fn call_digest(tool: &str, args: &Value) -> String {
    sha256_hex(canonical_json(&json!({"tool": tool, "args": args})).as_bytes())
}

/// A call's idempotency key (#44): base64url without padding of the
/// SHA-256 of `confirmation_id`, the task's index and its [`call_digest`],
/// each followed by a newline. The same on every attempt of one approved
/// call; two approved calls never share one (a pause's tasks differ by
/// index, two pauses by id).
pub fn idempotency_key(confirmation_id: &str, index: usize, args_digest: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for part in [confirmation_id, &index.to_string(), args_digest] {
        hasher.update(part.as_bytes());
        hasher.update(b"\n");
    }
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(hasher.finalize())
}

/// The lower-case hex SHA-256 of the canonical JSON of `{"tool", "args",
/// "body"}`: a preview's `digest`, what an approval names.
pub fn preview_digest(tool: &str, args: &Value, body: &str) -> String {
    sha256_hex(canonical_json(&json!({"tool": tool, "args": args, "body": body})).as_bytes())
}

/// The keys receipts are signed with and verified against.
pub struct ReceiptKeys {
    signing: SigningKey,
    /// The protected header, base64url: the same for every receipt.
    header: String,
    kid: String,
    issuer: String,
    /// `{"keys": [...]}`: the signing key's JWK first, then older ones.
    jwks: Value,
}

impl std::fmt::Debug for ReceiptKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceiptKeys")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl ReceiptKeys {
    /// The keys of `--receipt-key` (the first signs; the others are older
    /// keys, published only), or one made now when none is given.
    /// `issuer`: every receipt's `iss`.
    pub fn new(paths: &[PathBuf], issuer: String) -> Result<ReceiptKeys, String> {
        let (signing, older) = match paths.split_first() {
            Some((first, rest)) => {
                let signing = read_private(first)?;
                let older = rest
                    .iter()
                    .map(|path| read_public(path))
                    .collect::<Result<Vec<_>, _>>()?;
                (signing, older)
            }
            None => (SigningKey::generate(&mut rand_core::OsRng), Vec::new()),
        };
        let current = jwk(&signing.verifying_key());
        let kid = current["kid"].as_str().unwrap_or_default().to_owned();
        let mut keys = vec![current];
        for key in older {
            let key = jwk(&key);
            if !keys.iter().any(|k| k["kid"] == key["kid"]) {
                keys.push(key);
            }
        }
        let header = json!({"typ": "JWT", "alg": "EdDSA", "kid": kid});
        Ok(ReceiptKeys {
            signing,
            header: B64.encode(header.to_string()),
            kid,
            issuer,
            jwks: json!({ "keys": keys }),
        })
    }

    /// The signing key's id (its RFC 7638 thumbprint).
    pub fn kid(&self) -> &str {
        &self.kid
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// What `GET /.well-known/jwks.json` answers.
    pub fn jwks(&self) -> &Value {
        &self.jwks
    }

    /// `receipt` as a compact JWS, header `{"typ": "JWT", "alg": "EdDSA",
    /// "kid"}`.
    pub fn sign(&self, receipt: &Receipt) -> String {
        let payload = serde_json::to_vec(receipt).unwrap_or_default();
        let mut jws = String::with_capacity(self.header.len() + payload.len() * 4 / 3 + 92);
        jws.push_str(&self.header);
        jws.push('.');
        B64.encode_string(&payload, &mut jws);
        let signature = self.signing.sign(jws.as_bytes());
        jws.push('.');
        B64.encode_string(signature.to_bytes(), &mut jws);
        jws
    }
}

fn read_pem(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map_err(|err| format!("--receipt-key {}: cannot be read: {err}", path.display()))
}

fn read_private(path: &Path) -> Result<SigningKey, String> {
    SigningKey::from_pkcs8_pem(&read_pem(path)?).map_err(|err| {
        format!(
            "--receipt-key {}: not an Ed25519 private key in PKCS#8 PEM ({err}); make one with \
             `openssl genpkey -algorithm ed25519 -out receipt.pem`",
            path.display()
        )
    })
}

/// An older key: its private key's public half, or a public key (SPKI PEM).
fn read_public(path: &Path) -> Result<VerifyingKey, String> {
    let pem = read_pem(path)?;
    if let Ok(key) = SigningKey::from_pkcs8_pem(&pem) {
        return Ok(key.verifying_key());
    }
    VerifyingKey::from_public_key_pem(&pem).map_err(|err| {
        format!(
            "--receipt-key {}: not an Ed25519 key in PEM (PKCS#8 private or SPKI public): {err}",
            path.display()
        )
    })
}

/// base64url without padding, as JWS and JWK write bytes.
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// A public key as a JWK, `kid` its RFC 7638 thumbprint (SHA-256).
fn jwk(key: &VerifyingKey) -> Value {
    let x = B64.encode(key.as_bytes());
    // RFC 7638: the required members, sorted, no whitespace.
    let members = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#);
    let kid = {
        use sha2::Digest;
        B64.encode(sha2::Sha256::digest(members.as_bytes()))
    };
    json!({"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": "EdDSA", "use": "sig"})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idempotency_key_is_stable_and_names_exactly_one_call() {
        let digest = call_digest("mark", &json!({"a": 1}));
        let key = idempotency_key("c-1", 2, &digest);
        assert_eq!(
            key,
            idempotency_key("c-1", 2, &digest),
            "the same every attempt"
        );
        assert_eq!(key.len(), 43, "base64url of 32 bytes, no padding");
        assert!(key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_ne!(key, idempotency_key("c-1", 3, &digest), "another task");
        assert_ne!(key, idempotency_key("c-2", 2, &digest), "another pause");
        let other = call_digest("mark", &json!({"a": 2}));
        assert_ne!(key, idempotency_key("c-1", 2, &other), "other arguments");
        // Each part ends with a newline: "c-1"+"12" is not "c-11"+"2".
        assert_ne!(
            idempotency_key("c-1", 12, &digest),
            idempotency_key("c-11", 2, &digest)
        );
    }

    fn receipt() -> Receipt {
        Receipt {
            iss: "chatgate".to_owned(),
            confirmation_id: Some("c-1".to_owned()),
            session_id: "s".to_owned(),
            round: 1,
            task: TaskClaim {
                index: 1,
                tool: "note".to_owned(),
                args_digest: call_digest("note", &json!({"step": "x"})),
                preview_digest: None,
            },
            approved_by: vec!["key-1".to_owned()],
            via: Via::Chat,
            decided_at: "2026-11-29T00:00:00.000Z".to_owned(),
            idempotency_key: None,
        }
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let value = json!({"b": [{"z": 1, "a": "é"}], "a": null});
        assert_eq!(
            canonical_json(&value),
            r#"{"a":null,"b":[{"a":"é","z":1}]}"#
        );
        assert_eq!(
            call_digest("t", &json!({"x": 1})),
            sha256_hex(br#"{"args":{"x":1},"tool":"t"}"#)
        );
    }

    #[test]
    fn a_receipt_verifies_against_the_published_key() {
        let keys = ReceiptKeys::new(&[], "chatgate".to_owned()).unwrap();
        let token = keys.sign(&receipt());
        let jwk: jsonwebtoken::jwk::Jwk =
            serde_json::from_value(keys.jwks()["keys"][0].clone()).unwrap();
        assert_eq!(jwk.common.key_id.as_deref(), Some(keys.kid()));
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::EdDSA);
        validation.required_spec_claims.clear();
        validation.validate_exp = false;
        let decoded = jsonwebtoken::decode::<Value>(
            &token,
            &jsonwebtoken::DecodingKey::from_jwk(&jwk).unwrap(),
            &validation,
        )
        .unwrap();
        assert_eq!(decoded.header.kid.as_deref(), Some(keys.kid()));
        assert_eq!(decoded.claims["task"]["tool"], "note");
        assert_eq!(decoded.claims["task"]["preview_digest"], Value::Null);
        assert!(decoded.claims.get("idempotency_key").is_none());
    }

    #[test]
    fn a_key_file_is_read_and_a_bad_one_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("receipt.pem");
        use ed25519_dalek::pkcs8::EncodePrivateKey;
        let key = SigningKey::generate(&mut rand_core::OsRng);
        let pem = key.to_pkcs8_pem(Default::default()).unwrap();
        std::fs::write(&path, pem.as_bytes()).unwrap();
        let one = ReceiptKeys::new(std::slice::from_ref(&path), "i".to_owned()).unwrap();
        let two = ReceiptKeys::new(&[path.clone(), path.clone()], "i".to_owned()).unwrap();
        assert_eq!(one.kid(), two.kid(), "the same file, the same kid");
        assert_eq!(two.jwks()["keys"].as_array().unwrap().len(), 1);

        let bad = dir.path().join("bad.pem");
        std::fs::write(&bad, "not a key").unwrap();
        let err = ReceiptKeys::new(&[bad], "i".to_owned()).unwrap_err();
        assert!(err.contains("bad.pem") && err.contains("PKCS#8"), "{err}");
    }
}
