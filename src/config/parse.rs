//! How the flags' values are read and checked: durations in humantime or
//! the old bare unit, counts in a range, URLs, addresses, replica ids.

use std::time::Duration;

use clap::builder::TypedValueParser;

pub(super) const HOUR: Duration = Duration::from_secs(3600);
pub(super) const DAY: Duration = Duration::from_secs(24 * 3600);

/// A duration as a flag's default shows it (`5m`, `100ms`).
pub(super) fn text(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// `--replica-id`: 1 to 64 of letters, digits, `.`, `_`, `-`.
pub(super) fn parse_replica_id(text: &str) -> Result<String, String> {
    let fits = (1..=64).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if fits {
        Ok(text.to_owned())
    } else {
        Err("a replica id is 1 to 64 letters, digits, `.`, `_` or `-`".to_owned())
    }
}

/// `--advertise-url`: an `http://` or `https://` URL with a host; kept
/// without its trailing `/`.
pub(super) fn parse_advertise_url(text: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(text).map_err(|err| format!("not a URL: {err}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("write http://HOST:PORT (where the other replicas reach this one)".to_owned());
    }
    Ok(text.trim_end_matches('/').to_owned())
}

/// `--webhook`: an `http://` or `https://` URL with a host.
pub(super) fn parse_webhook_url(text: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(text).map_err(|err| format!("not a URL: {err}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("write http(s)://HOST[:PORT]/PATH, where events are POSTed".to_owned());
    }
    Ok(text.to_owned())
}

/// `--public-url`: an `http://` or `https://` URL with a host, kept without
/// its trailing `/`.
pub(super) fn parse_public_url(text: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(text).map_err(|err| format!("not a URL: {err}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("write http(s)://HOST[:PORT], where people open the page".to_owned());
    }
    Ok(text.trim_end_matches('/').to_owned())
}

/// A duration flag: humantime text (`300s`, `1h 30m`, `500ms`), or a bare
/// number in the flag's old unit; refused outside `min..=max`.
#[derive(Debug, Clone, Copy)]
pub struct DurationArg {
    bare_unit: Duration,
    min: Duration,
    max: Duration,
}

impl DurationArg {
    /// A bare number is seconds.
    pub const fn secs(min: Duration, max: Duration) -> DurationArg {
        DurationArg {
            bare_unit: Duration::from_secs(1),
            min,
            max,
        }
    }

    /// A bare number is milliseconds.
    pub const fn millis(min: Duration, max: Duration) -> DurationArg {
        DurationArg {
            bare_unit: Duration::from_millis(1),
            min,
            max,
        }
    }

    pub fn parse(&self, text: &str) -> Result<Duration, String> {
        let text = text.trim();
        let value = match text.parse::<u64>() {
            Ok(n) => u32::try_from(n)
                .ok()
                .and_then(|n| self.bare_unit.checked_mul(n))
                .ok_or_else(|| format!("`{text}` is too large"))?,
            Err(_) => humantime::parse_duration(text).map_err(|err| {
                format!("`{text}` is not a duration ({err}); write e.g. 300s, 500ms or 5m")
            })?,
        };
        if value < self.min || value > self.max {
            return Err(format!(
                "`{text}` is out of range: from {} to {}",
                humantime::format_duration(self.min),
                humantime::format_duration(self.max)
            ));
        }
        Ok(value)
    }
}

impl TypedValueParser for DurationArg {
    type Value = Duration;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Duration, clap::Error> {
        let text = value.to_str().ok_or_else(|| {
            clap::Error::raw(clap::error::ErrorKind::InvalidUtf8, "not UTF-8\n").with_cmd(cmd)
        })?;
        self.parse(text)
            .map_err(|why| invalid_value(cmd, arg, &why))
    }
}

/// `HOST:PORT`, with a port from 0 to 65535 (`[::1]:8080` for IPv6).
pub(super) fn parse_bind(text: &str) -> Result<String, String> {
    let port = text
        .rsplit_once(':')
        .map(|(host, port)| (host, port.parse::<u16>()));
    match port {
        Some((host, Ok(_))) if !host.is_empty() => Ok(text.to_owned()),
        _ => Err(format!(
            "`{text}` is not HOST:PORT; write e.g. 127.0.0.1:8080 (port 0 picks a free one)"
        )),
    }
}

/// A whole number in `min..=max`.
pub(super) fn parse_count(
    min: usize,
    max: usize,
) -> impl Fn(&str) -> Result<usize, String> + Clone {
    move |text: &str| match text.trim().parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "`{text}` is not a whole number from {min} to {max}"
        )),
    }
}

pub(super) fn invalid_value(
    cmd: &clap::Command,
    arg: Option<&clap::Arg>,
    why: &str,
) -> clap::Error {
    let name = arg.map_or_else(|| "value".to_owned(), |arg| format!("--{}", arg.get_id()));
    let name = name.replace('_', "-");
    clap::Error::raw(
        clap::error::ErrorKind::ValueValidation,
        format!("invalid value for {name}: {why}\n"),
    )
    .with_cmd(cmd)
}
