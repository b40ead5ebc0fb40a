//! The library's one source of randomness: backoff and wake jitter, lease
//! ids. Each thread draws from the operating system's generator
//! ([`rand::rng`]) unless the deterministic simulation (`sim` feature,
//! [`crate::sim`]) seeded it with [`seed`], so that a schedule replays from
//! its seed alone.

use std::cell::RefCell;

use rand::distr::uniform::{SampleRange, SampleUniform};
use rand::rngs::StdRng;
use rand::{Rng, RngCore};
use uuid::Uuid;

thread_local! {
    /// `Some` while this thread runs a seeded simulation.
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's generator: the seeded one if any, else the
/// operating system's.
fn with_rng<T>(f: impl FnOnce(&mut dyn RngCore) -> T) -> T {
    SEEDED.with(|seeded| match seeded.borrow_mut().as_mut() {
        Some(rng) => f(rng),
        None => f(&mut rand::rng()),
    })
}

/// A uniform pick in `range`.
pub(crate) fn random_range<T: SampleUniform, R: SampleRange<T>>(range: R) -> T {
    with_rng(|rng| rng.random_range(range))
}

/// A random (version 4) UUID, e.g. a lease id.
pub(crate) fn uuid() -> Uuid {
    let mut bytes = [0u8; 16];
    with_rng(|rng| rng.fill_bytes(&mut bytes));
    uuid::Builder::from_random_bytes(bytes).into_uuid()
}

/// The hasher state of the actor's and the twin's maps and sets: random per map (as
/// `std`'s), or fixed while a simulation runs on this thread, so that
/// iterating a map visits its entries in the same order on every run of a
/// seed.
#[cfg(feature = "sim")]
#[derive(Clone, Debug)]
pub(crate) struct HashState(Option<std::collections::hash_map::RandomState>);

#[cfg(feature = "sim")]
impl Default for HashState {
    fn default() -> Self {
        HashState((!is_seeded()).then(std::collections::hash_map::RandomState::new))
    }
}

#[cfg(feature = "sim")]
impl std::hash::BuildHasher for HashState {
    type Hasher = std::collections::hash_map::DefaultHasher;

    fn build_hasher(&self) -> Self::Hasher {
        match &self.0 {
            Some(random) => random.build_hasher(),
            None => std::collections::hash_map::DefaultHasher::new(),
        }
    }
}

/// The hasher state of the actor's maps and sets (see the `sim` build's).
#[cfg(not(feature = "sim"))]
pub(crate) type HashState = std::collections::hash_map::RandomState;

/// A `HashMap` with [`HashState`].
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, HashState>;

/// A `HashSet` with [`HashState`].
pub(crate) type HashSet<T> = std::collections::HashSet<T, HashState>;

/// Seeds this thread's generator (`Some`) or gives it back to the operating
/// system's (`None`).
#[cfg(feature = "sim")]
pub(crate) fn seed(seed: Option<u64>) {
    use rand::SeedableRng;
    SEEDED.with(|seeded| *seeded.borrow_mut() = seed.map(StdRng::seed_from_u64));
}

/// `true` while this thread's generator is seeded (a simulation runs).
#[cfg(feature = "sim")]
pub(crate) fn is_seeded() -> bool {
    SEEDED.with(|seeded| seeded.borrow().is_some())
}

#[cfg(test)]
mod tests;
