#![no_main]
// The property lives in crates/idalloc-fuzz (docs/design/fuzzing.md), shared with the stable CI run.
libfuzzer_sys::fuzz_target!(|data: &[u8]| idalloc_fuzz::escape::check(data));
