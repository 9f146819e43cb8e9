//! The values of the HTTP metrics' labels, each from a fixed set.
//!
//! A label value a client can choose is a way to grow `/metrics` without bound: 20,000 requests
//! with made-up methods once grew it from 2 KB to 33 MB. So a label never carries request text:
//! the method is one of the methods the API uses (anything else is `other`), the route is the
//! template of the route that matched, checked against the list of the router's routes (no match:
//! `other`), and the status is one the service answers (a three-digit number it chose itself).
//! Pure functions, so the bound is tested without a server.

use axum::http::Method;

/// The label of every value outside the fixed sets.
pub const OTHER: &str = "other";

/// Every route template of the router (`lib.rs`), as `MatchedPath` spells it. A test checks that
/// it lists exactly the routes the router serves.
pub const ROUTES: &[&str] = &[
    "/healthz",
    "/readyz",
    "/metrics",
    "/v1/openapi.json",
    "/v1/version",
    "/v1/pools",
    "/v1/pools/{pool}",
    "/v1/pools/{pool}/acquire",
    "/v1/pools/{pool}/release",
    "/v1/pools/{pool}/keys/{*key}",
    "/v1/pools/{pool}/ids/{id}",
    "/v1/pools/{pool}/bindings",
    "/v1/pools/{pool}/sweep",
    "/v1/pools/{pool}/watch",
    "/v1/sessions",
    "/v1/sessions/{id}",
    "/v1/sessions/{id}/keepalive",
];

/// The `method` label: the standard methods by name, anything else `other`.
pub fn method(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        _ => OTHER,
    }
}

/// The `route` label: the matched route template if it is one of [`ROUTES`], else `other`
/// (no route matched: an unknown path, whatever it was).
pub fn route(matched: Option<&str>) -> &'static str {
    matched.and_then(|m| ROUTES.iter().find(|r| **r == m).copied()).unwrap_or(OTHER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_up_methods_and_paths_are_other() {
        for m in ["FOO", "get", "BREW", "X-1234", "PROPFIND", "CONNECT", "TRACE"] {
            let m = Method::from_bytes(m.as_bytes()).expect("method token");
            assert_eq!(method(&m), OTHER, "{m}");
        }
        assert_eq!(method(&Method::GET), "GET");
        assert_eq!(method(&Method::DELETE), "DELETE");
        assert_eq!(route(None), OTHER);
        assert_eq!(route(Some("/v1/pools/vni/acquire")), OTHER, "a concrete path is not a label");
        assert_eq!(route(Some("/v1/pools/{pool}/acquire")), "/v1/pools/{pool}/acquire");
    }

    #[test]
    fn routes_lists_exactly_the_routers_routes() {
        let mut served: Vec<&str> =
            crate::tests::routes_in_source().into_iter().map(|(_, path)| path).collect();
        served.sort_unstable();
        served.dedup();
        let mut listed = ROUTES.to_vec();
        listed.sort_unstable();
        assert_eq!(served, listed);
    }
}
