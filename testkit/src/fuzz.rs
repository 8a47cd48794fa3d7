//! The bounded mutation fuzz the codecs run in `make test` (stable Rust, no
//! cargo-fuzz): a small seeded RNG and one mutator, with the format-aware steps
//! (length fields) given by each codec.

/// xorshift64*: small, seeded, reproducible.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// What a codec's fuzz changes besides random bytes.
pub struct Mutations<'a> {
    /// Byte values worth writing (boundaries of the format's fields).
    pub interesting: &'a [u8],
    /// At most this many random bytes are appended at once.
    pub max_append: usize,
    /// Pushed when a message becomes empty.
    pub fill: u8,
    /// Makes the outer length field agree with the message's length, so the
    /// mutation reaches the inner decoders; false when the message is too short.
    pub fix_length: &'a dyn Fn(&mut Vec<u8>) -> bool,
    /// Tampers with an inner length field; false when the message is too short
    /// (it must then not have used `Rng`).
    pub tamper_length: &'a dyn Fn(&mut Rng, &mut Vec<u8>) -> bool,
}

/// One to five mutations of `seed`: bit flips, interesting bytes, truncation,
/// random tails, the codec's length steps, splices with `corpus`, swaps.
pub fn mutate(r: &mut Rng, seed: &[u8], corpus: &[Vec<u8>], how: &Mutations<'_>) -> Vec<u8> {
    let mut m = seed.to_vec();
    for _ in 0..=r.below(4) {
        let step = r.below(8);
        let done = match step {
            0 => {
                let i = r.below(m.len());
                m[i] ^= 1 << r.below(8);
                true
            }
            1 => {
                let i = r.below(m.len());
                m[i] = how.interesting[r.below(how.interesting.len())];
                true
            }
            2 => {
                let n = r.below(m.len() + 1);
                m.truncate(n);
                true
            }
            3 => {
                for _ in 0..r.below(how.max_append) {
                    m.push(r.next_u64() as u8);
                }
                true
            }
            4 => (how.fix_length)(&mut m),
            5 => (how.tamper_length)(r, &mut m),
            6 => {
                let other = &corpus[r.below(corpus.len())];
                let at = r.below(m.len() + 1);
                let from = r.below(other.len());
                m.truncate(at);
                m.extend_from_slice(&other[from..]);
                true
            }
            _ => false,
        };
        if !done {
            let i = r.below(m.len());
            let j = r.below(m.len());
            m.swap(i, j);
        }
        if m.is_empty() {
            m.push(how.fill);
        }
    }
    m
}
