//! Wall-clock time as chatgate keeps it and shows it: milliseconds since
//! the Unix epoch in records, outboxes and headers; RFC 3339, UTC, on the
//! wire. One place for the conversions (a clock before 1970 reads as 0).
//! Owns no I/O.

use std::time::{Duration, SystemTime};

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    ms(SystemTime::now())
}

/// Milliseconds since the Unix epoch, now, as SQLite's INTEGER holds them.
pub fn now_ms_i64() -> i64 {
    i64::try_from(now_ms()).unwrap_or(i64::MAX)
}

/// `at` in milliseconds since the Unix epoch.
pub fn ms(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Whole seconds since the Unix epoch, now.
pub fn now_secs() -> u64 {
    now_ms() / 1000
}

/// The time `ms` milliseconds after the Unix epoch.
pub fn at(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

/// `at` as RFC 3339, UTC, in whole seconds (`2026-11-27T11:14:15Z`).
pub fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

/// `ms` as RFC 3339, UTC, with milliseconds (`2026-11-27T11:14:15.118Z`).
pub fn rfc3339_ms(ms: u64) -> String {
    humantime::format_rfc3339_millis(at(ms)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_and_rfc3339_round_trip() {
        let when = at(1_795_000_000_123);
        assert_eq!(ms(when), 1_795_000_000_123);
        assert_eq!(rfc3339_ms(1_795_000_000_123), "2026-11-18T11:06:40.123Z");
        assert_eq!(rfc3339(when), "2026-11-18T11:06:40Z");
        assert_eq!(ms(SystemTime::UNIX_EPOCH - Duration::from_secs(1)), 0);
    }
}
