//! Latency samples and their percentiles.

use std::time::Duration;

#[derive(Default)]
pub struct Samples {
    micros: Vec<u32>,
}

impl Samples {
    pub fn with_capacity(n: usize) -> Samples {
        Samples {
            micros: Vec::with_capacity(n),
        }
    }

    pub fn push(&mut self, d: Duration) {
        self.micros.push(d.as_micros().min(u32::MAX as u128) as u32);
    }

    pub fn extend(&mut self, other: Samples) {
        self.micros.extend(other.micros);
    }

    pub fn len(&self) -> usize {
        self.micros.len()
    }

    /// p50, p90, p99 and max, in microseconds.
    pub fn summary(&mut self) -> Summary {
        self.micros.sort_unstable();
        let at = |q: f64| -> u32 {
            if self.micros.is_empty() {
                return 0;
            }
            let i =
                ((self.micros.len() as f64 * q).ceil() as usize).clamp(1, self.micros.len()) - 1;
            self.micros[i]
        };
        Summary {
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: self.micros.last().copied().unwrap_or(0),
            n: self.micros.len(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub p50: u32,
    pub p90: u32,
    pub p99: u32,
    pub max: u32,
    pub n: usize,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "p50 {:>7.1} µs  p90 {:>7.1} µs  p99 {:>7.1} µs  max {:>8.1} µs  (n={})",
            self.p50 as f64, self.p90 as f64, self.p99 as f64, self.max as f64, self.n
        )
    }
}
