//! The pure input parsers of the `idalloc` command, as a library.
//!
//! The binary (`src/main.rs`) calls them, and so do the fuzz properties of `crates/idalloc-fuzz`
//! (docs/design/fuzzing.md): a library target is how another crate reaches the exact code the binary
//! runs, rather than a copy of it. Only parsers that need no I/O live here.

pub mod keys;
