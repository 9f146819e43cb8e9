//! The OpenAPI document as this service serves it: `openapi.json` (written for a service with
//! tokens) with its security as configured. Without `--auth-tokens` no operation
//! needs a token and none answers 401 or 403, so the served document says so; a fuzzer driven by
//! it (schemathesis, in the tests) then holds the service to exactly what it does.

use serde_json::Value;

/// The document served at `/v1/openapi.json`: [`crate::OPENAPI`] as is with tokens; without,
/// no security requirement and no 401/403 answers.
pub fn document(tokens: bool) -> String {
    if tokens {
        return crate::OPENAPI.to_string();
    }
    let Ok(mut doc) = serde_json::from_str::<Value>(crate::OPENAPI) else {
        // A unit test parses the embedded document: unreachable in a built service.
        return crate::OPENAPI.to_string();
    };
    doc["security"] = Value::Array(Vec::new());
    if let Some(paths) = doc["paths"].as_object_mut() {
        for op in paths.values_mut().filter_map(Value::as_object_mut).flat_map(|m| m.values_mut()) {
            if let Some(op) = op.as_object_mut() {
                op.remove("security");
                if let Some(r) = op.get_mut("responses").and_then(Value::as_object_mut) {
                    r.remove("401");
                    r.remove("403");
                }
            }
        }
    }
    doc.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_tokens_no_operation_needs_one_or_answers_401() {
        let open: Value = serde_json::from_str(&document(false)).expect("JSON");
        assert_eq!(open["security"], serde_json::json!([]));
        let text = open["paths"].to_string();
        assert!(!text.contains("E401") && !text.contains("E403"), "{text}");
        let locked: Value = serde_json::from_str(&document(true)).expect("JSON");
        assert_eq!(locked["security"], serde_json::json!([{"bearer": []}]));
        assert!(locked["paths"]["/v1/pools"]["get"]["responses"]["401"].is_object());
    }

    /// The error kinds the document promises are the wire crate's (which the Rust client maps),
    /// no more and no fewer: a kind added on one side only fails here.
    #[test]
    fn the_documented_error_kinds_are_the_wire_kinds() {
        let doc: Value = serde_json::from_str(crate::OPENAPI).expect("JSON");
        let documented = doc["components"]["schemas"]["Error"]["properties"]["kind"]["enum"]
            .as_array()
            .expect("an enum of kinds");
        let mut documented: Vec<&str> = documented.iter().filter_map(Value::as_str).collect();
        let mut wire = idalloc_wire::errors::kind::ALL.to_vec();
        documented.sort_unstable();
        wire.sort_unstable();
        assert_eq!(documented, wire);
    }
}
