//! Latency percentiles from every sample.
//!
//! Why a sorted `Vec` and not `hdrhistogram`: a run keeps at most a few
//! hundred thousand samples (8 bytes each), sorting them once after the timed
//! section costs milliseconds, and the percentiles are then exact (nearest
//! rank) rather than bucketed, with no extra dependency.

use std::time::Duration;

/// Every latency of one run, in nanoseconds, sorted.
#[derive(Debug, Clone, Default)]
pub struct Latencies(Vec<u64>);

impl Latencies {
    pub fn new(mut nanos: Vec<u64>) -> Self {
        nanos.sort_unstable();
        Latencies(nanos)
    }

    /// Add another run's samples.
    pub fn merge(&mut self, other: Latencies) {
        self.0.extend(other.0);
        self.0.sort_unstable();
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The nearest-rank percentile `q` (0 < q <= 1): the smallest sample that
    /// at least `q` of all samples do not exceed. Zero when there are none.
    pub fn percentile(&self, q: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let rank = (q * self.0.len() as f64).ceil() as usize;
        let index = rank.clamp(1, self.0.len()) - 1;
        Duration::from_nanos(self.0[index])
    }
}
