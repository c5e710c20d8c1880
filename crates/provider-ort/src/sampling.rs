//! Choosing the next token from logits: greedy, or sampling with
//! temperature, top-k, top-p and a repetition penalty, from a seeded
//! generator so that a seed reproduces a generation.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};

/// How the next token is chosen. The default is greedy decoding, which small
/// models need to write tool calls reliably.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingOptions {
    /// Softmax temperature; `0.0` (the default) means greedy: always the most
    /// likely token.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` (the default) keeps all.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probabilities add up to `top_p`;
    /// `1.0` (the default) keeps all.
    pub top_p: f32,
    /// Seed of the random generator; `None` (the default) seeds from the OS,
    /// so every generation differs.
    pub seed: Option<u64>,
    /// Divides positive logits (multiplies negative ones) of tokens already
    /// in the prompt or the answer, as in Hugging Face's
    /// `repetition_penalty`; `1.0` (the default) is off. Applies to greedy
    /// decoding too.
    pub repetition_penalty: f32,
}

impl Default for SamplingOptions {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: None,
            repetition_penalty: 1.0,
        }
    }
}

impl SamplingOptions {
    /// Greedy decoding (the default).
    pub fn greedy() -> Self {
        Self::default()
    }

    /// Sampling at `temperature` with a fixed seed.
    pub fn seeded(temperature: f32, seed: u64) -> Self {
        Self {
            temperature,
            seed: Some(seed),
            ..Self::default()
        }
    }

    /// Whether tokens are chosen greedily.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

/// Picks tokens; one per generation, so that a seed covers the whole answer.
#[derive(Debug, Clone)]
pub struct Sampler {
    /// The options it was made with.
    options: SamplingOptions,
    /// The random generator (unused when greedy).
    rng: Xoshiro256,
    /// Tokens the repetition penalty applies to.
    seen: HashSet<u32>,
    /// Scratch buffer of candidate (id, logit) pairs, kept to avoid an
    /// allocation per token.
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler for one generation. `context` are the prompt's tokens (for
    /// the repetition penalty).
    pub fn new(options: &SamplingOptions, context: &[u32]) -> Self {
        let seed = options
            .seed
            .unwrap_or_else(|| RandomState::new().hash_one(std::time::SystemTime::now()));
        let seen = if options.repetition_penalty != 1.0 {
            context.iter().copied().collect()
        } else {
            HashSet::new()
        };
        Self {
            options: options.clone(),
            rng: Xoshiro256::new(seed),
            seen,
            candidates: Vec::new(),
        }
    }

    /// Chooses the next token from `logits` (changed in place by the
    /// penalty) and remembers it for the penalty.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        self.sample_as(logits, self.options.is_greedy())
    }

    /// As [`Self::sample`], greedily when `greedy` whatever the options say.
    pub fn sample_as(&mut self, logits: &mut [f32], greedy: bool) -> u32 {
        let penalty = self.options.repetition_penalty;
        if penalty != 1.0 {
            for &id in &self.seen {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
                }
            }
        }
        let id = if greedy {
            argmax(logits)
        } else {
            self.sample_random(logits)
        };
        if penalty != 1.0 {
            self.seen.insert(id);
        }
        id
    }

    /// Remembers a token that was not sampled (one a grammar forced), so
    /// the repetition penalty sees it as it would a sampled one.
    pub fn remember(&mut self, id: u32) {
        if self.options.repetition_penalty != 1.0 {
            self.seen.insert(id);
        }
    }

    fn sample_random(&mut self, logits: &[f32]) -> u32 {
        let o = &self.options;
        let c = &mut self.candidates;
        c.clear();
        c.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_finite())
                .map(|(i, &l)| (i as u32, l / o.temperature)),
        );
        if c.is_empty() {
            return argmax(logits);
        }
        let by_logit_desc =
            |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if o.top_k > 0 && o.top_k < c.len() {
            c.select_nth_unstable_by(o.top_k - 1, by_logit_desc);
            c.truncate(o.top_k);
        }
        c.sort_unstable_by(by_logit_desc);
        let max = c[0].1;
        let mut total = 0.0f64;
        for (_, l) in c.iter_mut() {
            *l = (*l - max).exp();
            total += f64::from(*l);
        }
        if o.top_p < 1.0 {
            let mut acc = 0.0f64;
            let mut keep = c.len();
            for (i, (_, p)) in c.iter().enumerate() {
                acc += f64::from(*p) / total;
                if acc >= f64::from(o.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep);
            total = c.iter().map(|(_, p)| f64::from(*p)).sum();
        }
        let mut r = self.rng.next_f64() * total;
        for &(id, p) in c.iter() {
            r -= f64::from(p);
            if r <= 0.0 {
                return id;
            }
        }
        c[c.len() - 1].0
    }
}

/// The index of the largest logit; the first one on ties, as numpy's argmax.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    let mut best_value = f32::NEG_INFINITY;
    for (i, &l) in logits.iter().enumerate() {
        if l > best_value {
            best = i;
            best_value = l;
        }
    }
    best as u32
}

/// xoshiro256** seeded through SplitMix64: small, fast, and the same stream
/// for the same seed on every platform (which `rand`'s `StdRng` does not
/// promise across versions).
#[derive(Debug, Clone)]
struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Self {
            s: [next(), next(), next(), next()],
        }
    }

    fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(&SamplingOptions::greedy(), &[]);
        assert_eq!(s.sample(&mut [0.1, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn a_seed_reproduces_the_draws() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let draw = |seed| {
            let mut s = Sampler::new(&SamplingOptions::seeded(1.0, seed), &[]);
            (0..20)
                .map(|_| s.sample(&mut logits.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn top_k_one_is_greedy() {
        let opts = SamplingOptions {
            top_k: 1,
            ..SamplingOptions::seeded(5.0, 1)
        };
        let mut s = Sampler::new(&opts, &[]);
        for _ in 0..20 {
            assert_eq!(s.sample(&mut [0.0, 1.0, 0.5]), 1);
        }
    }

    #[test]
    fn tiny_top_p_keeps_only_the_best() {
        let opts = SamplingOptions {
            top_p: 0.01,
            ..SamplingOptions::seeded(1.0, 3)
        };
        let mut s = Sampler::new(&opts, &[]);
        for _ in 0..20 {
            assert_eq!(s.sample(&mut [0.0, 2.0, 1.9]), 1);
        }
    }

    #[test]
    fn repetition_penalty_moves_greedy_off_a_seen_token() {
        let opts = SamplingOptions {
            repetition_penalty: 2.0,
            ..SamplingOptions::greedy()
        };
        let mut s = Sampler::new(&opts, &[1]);
        assert_eq!(s.sample(&mut [0.0, 2.0, 1.5]), 2);
    }
}
