//! Random-kill soaks: how many cycles (`LINKBUS_SOAK_CYCLES`) and a seeded generator
//! (`LINKBUS_SOAK_SEED`, else the clock; printed, so a failing run can be repeated).

/// A soak's length and its random numbers.
pub struct Soak {
    /// Cycles to run.
    pub cycles: usize,
    seed: u64,
}

impl Soak {
    /// `cycles` cycles, seeded from `LINKBUS_SOAK_SEED` or the clock.
    pub fn new(cycles: usize) -> Self {
        let seed =
            std::env::var("LINKBUS_SOAK_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_nanos()
                    as u64
            }) | 1;
        eprintln!("soak seed {seed}, {cycles} cycles");
        Self { cycles, seed }
    }

    /// `LINKBUS_SOAK_CYCLES` cycles (else `default`), seeded as [`Soak::new`].
    pub fn from_env(default: usize) -> Self {
        Self::new(std::env::var("LINKBUS_SOAK_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(default))
    }

    /// A number below `bound` (xorshift64).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        self.seed % bound
    }
}

/// The payload length of message `i` of a soak's cycle: mostly short ones (copied behind
/// their heads on a link), every fourth long enough to be shared rather than copied.
pub fn soak_payload_len(i: u64) -> usize {
    if i % 4 == 3 { 700 } else { 64 }
}
