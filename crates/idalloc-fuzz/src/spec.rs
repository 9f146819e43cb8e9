//! Target `spec_json`: pool spec JSON as it is read from spec records (`PoolSpec::from_json`)
//! and as the HTTP service reads `POST /v1/pools` bodies (`PoolSpecBody`).
//!
//! Properties: a spec that is accepted is valid and round-trips through JSON (the stored form
//! and the HTTP form); bad JSON or a bad spec gets an error, never a panic, and its message says
//! what was wrong.

use idalloc::PoolSpec;
use idalloc_server::api::{PoolSpecBody, SpecBody};

/// Input: the JSON bytes.
pub fn check(data: &[u8]) {
    match PoolSpec::from_json(data) {
        Ok(spec) => accepted(&spec),
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.is_empty(), "a refused spec gets a message");
        }
    }
    // The HTTP form: parsed strictly, converted, validated by the library when used.
    if let Ok(body) = serde_json::from_slice::<PoolSpecBody>(data) {
        match body.to_spec() {
            Ok(spec) if spec.validate().is_ok() => {
                accepted(&spec);
                let again = PoolSpecBody::from_spec(&spec).to_spec();
                assert_eq!(again.as_ref().ok(), Some(&spec), "HTTP form round trip");
            }
            Ok(_) => {}
            Err(e) => assert!(!format!("{e:?}").is_empty()),
        }
    }
}

fn accepted(spec: &PoolSpec) {
    assert!(spec.validate().is_ok(), "an accepted spec is valid: {spec:?}");
    let json = spec.to_json();
    let back = PoolSpec::from_json(&json);
    assert_eq!(
        back.as_ref(),
        Ok(spec),
        "stored form round trip via {}",
        String::from_utf8_lossy(&json)
    );
    assert_eq!(back.map(|s| s.to_json()).ok(), Some(json), "to_json is stable");
}
