//! The fuzz properties on stable Rust, as CI runs them (docs/design/fuzzing.md): each target's stored
//! corpus (`fuzz/corpus/<target>/`, seeds and every input that ever failed) replayed, then a
//! bounded number of `proptest` cases from a fixed seed, so a run is repeatable and takes seconds.
//! cargo-fuzz (nightly) runs the same functions coverage-guided.

use std::path::PathBuf;

use idalloc_fuzz::TARGETS;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target)
}

/// Replays every stored input of every target; a target without a corpus fails the test.
#[test]
fn stored_corpus_replays_clean() {
    for (target, check) in TARGETS {
        let dir = corpus_dir(target);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
            .map(|e| e.expect("corpus entry").path())
            .collect();
        files.sort();
        assert!(
            files.len() >= 20,
            "{target}: only {} corpus files in {}",
            files.len(),
            dir.display()
        );
        for f in &files {
            let data = std::fs::read(f).expect("corpus file");
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(outcome.is_ok(), "{target}: corpus file {} fails its property", f.display());
        }
    }
}

/// Bytes biased towards the ones the decoders care about (separators, escapes, hex digits, the
/// tombstone mark, JSON punctuation), with any byte now and then.
fn interesting_byte() -> impl Strategy<Value = u8> {
    const SET: &[u8] = b"/%\n\r\0\x1f\x7f\xff\xfeAF09az -.{}[]\":,";
    prop_oneof![3 => proptest::sample::select(SET), 1 => any::<u8>()]
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(interesting_byte(), 0..max)
}

/// Runs `cases` inputs from a fixed seed (repeatable in CI), shrinking a failure to a small input.
fn run(cases: u32, strategy: impl Strategy<Value = Vec<u8>>, check: fn(&[u8])) {
    let config = Config { cases, failure_persistence: None, ..Config::default() };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[22; 32]);
    let mut runner = TestRunner::new_with_rng(config, rng);
    if let Err(e) = runner.run(&strategy, |data| {
        check(&data);
        Ok(())
    }) {
        panic!("{e}");
    }
}

#[test]
fn records() {
    run(3000, bytes(300), idalloc_fuzz::records::check);
}

#[test]
fn key_escape() {
    run(3000, bytes(80), idalloc_fuzz::escape::check);
}

#[test]
fn from_input() {
    run(3000, bytes(200), idalloc_fuzz::from_input::check);
}

/// Spec JSON: mostly well-formed specs with edge values (so validation, not the JSON parser,
/// decides), some with a byte changed, some noise.
fn spec_json() -> impl Strategy<Value = Vec<u8>> {
    let num = prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(u64::MAX),
        Just(1 << 32),
        any::<u64>(),
        0..100u64
    ];
    let name =
        prop_oneof![Just("p".to_string()), Just("a.b-c_1".to_string()), "[a-zA-Z0-9._/-]{0,70}"];
    let strategy = prop_oneof![Just("random"), Just("lowest"), Just("Lowest"), Just("")];
    let spec = (
        name,
        num.clone(),
        num.clone(),
        proptest::collection::vec((num.clone(), num.clone()), 0..4),
        num.clone(),
        strategy,
        num.clone(),
        num,
        any::<bool>(),
    )
        .prop_map(|(name, min, max, reserved, prefix, strategy, grace, delay, extra)| {
            let mut v = serde_json::json!({
                "name": name, "min": min, "max": max, "reserved": reserved, "prefix": prefix,
                "strategy": strategy, "idle_grace_ms": grace, "reuse_delay_ms": delay,
            });
            if extra {
                v["future_field"] = serde_json::json!(1);
            }
            serde_json::to_vec(&v).expect("JSON")
        });
    let damaged = (spec.clone(), any::<prop::sample::Index>(), interesting_byte()).prop_map(
        |(mut json, at, b)| {
            let i = at.index(json.len());
            json[i] = b;
            json
        },
    );
    prop_oneof![4 => spec, 2 => damaged, 1 => bytes(100)]
}

#[test]
fn spec_json_cases() {
    run(3000, spec_json(), idalloc_fuzz::spec::check);
}

/// HTTP bodies: a route selector then JSON that is close to what each route reads.
fn http_body() -> impl Strategy<Value = Vec<u8>> {
    let key = prop_oneof![
        Just("k".to_string()),
        Just("a/b".to_string()),
        "[ -~]{0,12}",
        Just(String::new())
    ];
    let bodies = prop_oneof![
        (key.clone(), proptest::collection::vec(key.clone(), 0..4), prop::option::of(key.clone()))
            .prop_map(|(k, ks, h)| {
                serde_json::to_vec(&serde_json::json!({"key": k, "keys": ks, "holder": h}))
                    .expect("JSON")
            }),
        (key.clone(), prop::option::of(key.clone())).prop_map(|(k, h)| {
            let mut v = serde_json::json!({"key": k});
            if let Some(h) = h {
                v["holder"] = h.into();
            }
            serde_json::to_vec(&v).expect("JSON")
        }),
        prop_oneof![Just(0u64), Just(1), Just(86_400), Just(86_401), any::<u64>()]
            .prop_map(|ttl| format!("{{\"ttl\":{ttl}}}").into_bytes()),
        spec_json(),
        bytes(60),
    ];
    (any::<u8>(), bodies).prop_map(|(route, body)| {
        let mut v = vec![route];
        v.extend(body);
        v
    })
}

#[test]
fn http_body_cases() {
    run(400, http_body(), idalloc_fuzz::http::check);
}

/// Damaged store files: patches of a few bytes anywhere, cuts, and whole garbage files.
fn damaged_file() -> impl Strategy<Value = Vec<u8>> {
    let patch =
        (any::<u32>(), proptest::collection::vec(any::<u8>(), 1..16)).prop_map(|(at, bytes)| {
            let mut v = at.to_le_bytes().to_vec();
            v.push(bytes.len() as u8);
            v.extend(bytes);
            v
        });
    prop_oneof![
        4 => proptest::collection::vec(patch, 1..4).prop_map(|ps| {
            let mut v = vec![2u8];
            ps.into_iter().for_each(|p| v.extend(p));
            v
        }),
        1 => any::<u32>().prop_map(|len| {
            let mut v = vec![1u8];
            v.extend(len.to_le_bytes());
            v
        }),
        1 => proptest::collection::vec(any::<u8>(), 0..64).prop_map(|b| {
            let mut v = vec![0u8];
            v.extend(b);
            v
        }),
    ]
}

#[test]
fn damaged_file_cases() {
    run(300, damaged_file(), idalloc_fuzz::damaged_file::check);
}
