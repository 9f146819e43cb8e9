//! Target `key_escape`: the escaping of keys and holders into record-name segments
//! (`idalloc::layout::{enc, dec}`), on which "no reference left for key k" as one range compare
//! rests (DESIGN §4).
//!
//! Properties: `enc` never yields `/` or a control byte; `dec(enc(s)) == s`; `dec` accepts only
//! what `enc` produces (`enc(dec(t)) == t`), so one key has one record name; `enc` is injective;
//! and the reference prefix of one key covers the references of that key only.

use idalloc::layout::{dec, enc, Layout};

use crate::input::Input;

/// Input: one split byte, then bytes read as two strings (lossy UTF-8) `a` and `b`.
pub fn check(data: &[u8]) {
    let mut input = Input::new(data);
    let split = input.byte() as usize;
    let rest = input.rest();
    let (a, b) = rest.split_at(split.min(rest.len()));
    let (a, b) = (String::from_utf8_lossy(a), String::from_utf8_lossy(b));
    for s in [&a, &b] {
        let e = enc(s);
        assert!(!e.contains('/'), "enc({s:?}) = {e:?} contains '/'");
        assert!(!e.bytes().any(|c| c < 0x20 || c == 0x7f), "enc({s:?}) = {e:?} has a control byte");
        assert_eq!(dec(&e).as_deref(), Some(s.as_ref()), "dec(enc({s:?}))");
    }
    assert_eq!(a == b, enc(&a) == enc(&b), "enc is not injective on {a:?}, {b:?}");
    // Strictness: whatever `dec` accepts is exactly what `enc` writes for it.
    for raw in [rest, data] {
        if let Ok(t) = std::str::from_utf8(raw) {
            if let Some(s) = dec(t) {
                assert_eq!(enc(&s), t, "dec({t:?}) = {s:?} but enc gives another name");
            }
        }
    }
    // `ref/<enc(a)>/` covers `ref/<enc(b)>/<enc(h)>` only when a == b.
    if !a.is_empty() && !b.is_empty() {
        let l = Layout::default();
        let covered = l.ref_key("p", &b, "h").starts_with(&l.ref_prefix("p", &a));
        assert_eq!(covered, a == b, "ref prefix of {a:?} vs reference of {b:?}");
    }
}
