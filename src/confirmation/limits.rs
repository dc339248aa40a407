//! How many runs the registry holds: in all (`--max-runs`) and per API key
//! (`--max-runs-per-key`).

/// Default of `--max-runs`: runs held at once (the open-files limit is 20,000).
pub const MAX_RUNS: usize = 20_000;
/// With API keys on and no `--max-runs-per-key`, one key may hold this
/// fraction of `--max-runs` (1/4), so one key cannot lock the others out.
pub const RUNS_PER_KEY_DIVISOR: usize = 4;

/// How many runs the registry holds: in all, and per owner (API key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    pub max_runs: usize,
    pub per_owner: usize,
}

impl RunLimits {
    /// `max_runs` in all; per API key `per_key` (at most `max_runs`), or
    /// with keys on a quarter of `max_runs`; without keys the one
    /// anonymous owner may use all of it.
    pub fn for_keys(max_runs: usize, per_key: Option<usize>, keys_on: bool) -> RunLimits {
        let per_owner = match (keys_on, per_key) {
            (false, _) => max_runs,
            (true, Some(limit)) => limit.min(max_runs),
            (true, None) => (max_runs / RUNS_PER_KEY_DIVISOR).max(1),
        };
        RunLimits {
            max_runs,
            per_owner,
        }
    }

    /// No limit at all (tests).
    pub const UNLIMITED: RunLimits = RunLimits {
        max_runs: usize::MAX,
        per_owner: usize::MAX,
    };

    /// `max` runs in all, and all of them for one owner.
    pub fn total(max: usize) -> RunLimits {
        RunLimits {
            max_runs: max,
            per_owner: max,
        }
    }
}
