//! idalloc's fuzz properties (docs/fuzzing.md).
//!
//! One public function per fuzz target, taking the raw input bytes and panicking when a property
//! fails. The same functions run in two engines, so what is checked is written once:
//! - `fuzz/fuzz_targets/<target>.rs` (cargo-fuzz, nightly): coverage-guided libFuzzer;
//! - `tests/properties.rs` (stable, in CI): replays the stored corpus `fuzz/corpus/<target>/` and
//!   runs a bounded number of `proptest` cases.
//!
//! The properties are more than "no panic": decoders and encoders round-trip, the key escaping is
//! injective and never yields `/`, an accepted spec round-trips through JSON, and bad input gets
//! an error that names what was wrong.

pub mod damaged_file;
pub mod escape;
pub mod from_input;
pub mod http;
mod input;
pub mod panics;
pub mod records;
pub mod spec;

/// A property: panics when the input breaks it.
pub type Property = fn(&[u8]);

/// Every target's name (its corpus folder and fuzz target) with its property.
pub const TARGETS: &[(&str, Property)] = &[
    ("records", records::check),
    ("spec_json", spec::check),
    ("key_escape", escape::check),
    ("from_input", from_input::check),
    ("http_body", http::check),
    ("damaged_file", damaged_file::check),
];
