//! Cilium-style label sets as keys: [`Labels`] renders the sorted form Cilium's identity
//! allocator stores its keys in (`Labels.SortedList` of Cilium's `pkg/labels`): every label as
//! `source:key=value;`, ordered by key, so one set of labels is one key whatever order its labels
//! were given in. For example `k8s:app=web;k8s:io.kubernetes.pod.namespace=default;`.
//!
//! Pure: strings in, strings out. A set holds at most one label per key (Cilium's `Labels` is a
//! map by key); [`Labels::insert`] replaces, [`Labels::parse`] and [`Labels::from_labels`]
//! refuse a key given twice.
//!
//! The rendering is read back unambiguously because each part is restricted where the next
//! separator is looked for: a source has no `:`, `=` or `;`; a key has no `=` or `;` (it may
//! have `:`, as in `reserved:host` keys); a value has no `;` (it may have `=`). Parsing splits a
//! label at its first `:` and then its first `=`, so `parse(render(s)) == s` for every set
//! (a property test checks it).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Input, Result};

const SOURCE_RULE: &str = "a label source is 1 or more characters without ':', '=' or ';'";
const KEY_RULE: &str = "a label key is 1 or more characters without '=' or ';'";
const VALUE_RULE: &str = "a label value has no ';'";
const FORM_RULE: &str = "a label set is labels of the form source:key=value, each ended by ';' \
                         (e.g. k8s:app=web;k8s:io.kubernetes.pod.namespace=default;), \
                         at most one per key";

/// One label: where it comes from (`k8s`, `container`, `reserved`, `cidr`…), its key and value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Label {
    source: String,
    key: String,
    value: String,
}

impl Label {
    /// A label, checked (see the module docs for what each part may hold).
    pub fn new(
        source: impl Into<String>,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<Label> {
        let (source, key, value) = (source.into(), key.into(), value.into());
        if source.is_empty() || source.contains([':', '=', ';']) {
            return Err(Error::invalid_str(Input::Key, "label source", &source, SOURCE_RULE));
        }
        if key.is_empty() || key.contains(['=', ';']) {
            return Err(Error::invalid_str(Input::Key, "label key", &key, KEY_RULE));
        }
        if value.contains(';') {
            return Err(Error::invalid_str(Input::Key, "label value", &value, VALUE_RULE));
        }
        Ok(Label { source, key, value })
    }

    /// Parses one label, `source:key=value` (without the `;`).
    pub fn parse(s: &str) -> Result<Label> {
        let bad = || Error::invalid_str(Input::Key, "label", s, FORM_RULE);
        let (source, rest) = s.split_once(':').ok_or_else(bad)?;
        let (key, value) = rest.split_once('=').ok_or_else(bad)?;
        Label::new(source, key, value)
    }

    /// Where the label comes from.
    pub fn source(&self) -> &str {
        &self.source
    }
    /// The label's key.
    pub fn key(&self) -> &str {
        &self.key
    }
    /// The label's value (may be empty).
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl fmt::Display for Label {
    /// `source:key=value`, without the `;` that ends it in a set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}={}", self.source, self.key, self.value)
    }
}

/// A set of labels, at most one per key, usable as a pool key in its sorted form
/// ([`Labels::as_str`], `AsRef<str>`).
///
/// ```
/// use idalloc::labels::{Label, Labels};
/// let labels = Labels::from_labels([
///     Label::new("k8s", "io.kubernetes.pod.namespace", "default")?,
///     Label::new("k8s", "app", "web")?,
/// ])?;
/// assert_eq!(labels.as_str(), "k8s:app=web;k8s:io.kubernetes.pod.namespace=default;");
/// assert_eq!(Labels::parse(labels.as_str())?, labels);
///
/// // As a key: one identity per label set, whatever order the labels came in.
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let alloc = idalloc::Allocator::new(
///     idalloc::store::embedded::EmbeddedStore::memory(),
///     idalloc::AllocatorOptions::default(),
/// )?;
/// let identities = alloc.ensure_pool(&idalloc::PoolSpec::new("identities", 256, 65_535)).await?;
/// let id = identities.acquire(labels.as_str()).await?.id;
/// let same: Labels = "k8s:io.kubernetes.pod.namespace=default;k8s:app=web;".parse()?;
/// assert_eq!(identities.acquire_many(&[same]).await[0].as_ref().map(|a| a.id), Ok(id));
/// # Ok::<(), idalloc::Error>(())
/// # })?;
/// # Ok::<(), idalloc::Error>(())
/// ```
///
/// `idalloc-client` re-exports both types: its pools take a set the same way.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Labels {
    /// By key: the sort order of the rendering.
    by_key: BTreeMap<String, Label>,
    /// The rendering, kept in step with `by_key`.
    rendered: String,
}

impl Labels {
    /// The empty set (renders as `""`, which is no valid pool key: add labels first).
    pub fn new() -> Labels {
        Labels::default()
    }

    /// The set of `labels`; a key given twice is refused, naming it.
    pub fn from_labels(labels: impl IntoIterator<Item = Label>) -> Result<Labels> {
        let mut set = Labels::new();
        for l in labels {
            if set.by_key.contains_key(&l.key) {
                return Err(Error::invalid_str(
                    Input::Key,
                    "label key given twice",
                    &l.key,
                    FORM_RULE,
                ));
            }
            set.by_key.insert(l.key.clone(), l);
        }
        set.render();
        Ok(set)
    }

    /// Parses a rendered set: labels `source:key=value`, each ended by `;`, in any order (the
    /// result renders sorted). `""` is the empty set.
    pub fn parse(s: &str) -> Result<Labels> {
        let Some(body) = s.strip_suffix(';') else {
            if s.is_empty() {
                return Ok(Labels::new());
            }
            return Err(Error::invalid_str(Input::Key, "label set", s, FORM_RULE));
        };
        let labels = body.split(';').map(Label::parse).collect::<Result<Vec<_>>>()?;
        Labels::from_labels(labels)
    }

    /// Adds `label`, returning the label it replaces (the one with the same key), as Cilium's
    /// map does.
    pub fn insert(&mut self, label: Label) -> Option<Label> {
        let old = self.by_key.insert(label.key.clone(), label);
        self.render();
        old
    }

    /// The label with key `key`.
    pub fn get(&self, key: &str) -> Option<&Label> {
        self.by_key.get(key)
    }

    /// The labels in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &Label> + ExactSizeIterator {
        self.by_key.values()
    }

    /// How many labels.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// No labels.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The sorted form: `source:key=value;` per label, by key.
    pub fn as_str(&self) -> &str {
        &self.rendered
    }

    fn render(&mut self) {
        let len = self.by_key.values().map(|l| l.source.len() + l.key.len() + l.value.len() + 3);
        let mut out = String::with_capacity(len.sum());
        for l in self.by_key.values() {
            out.push_str(&l.source);
            out.push(':');
            out.push_str(&l.key);
            out.push('=');
            out.push_str(&l.value);
            out.push(';');
        }
        self.rendered = out;
    }
}

impl AsRef<str> for Labels {
    fn as_ref(&self) -> &str {
        &self.rendered
    }
}

impl fmt::Display for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.rendered)
    }
}

impl FromStr for Labels {
    type Err = Error;
    fn from_str(s: &str) -> Result<Labels> {
        Labels::parse(s)
    }
}

impl From<Labels> for String {
    fn from(l: Labels) -> String {
        l.rendered
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn renders_cilium_sorted_form() {
        let mut l = Labels::new();
        l.insert(Label::parse("k8s:io.kubernetes.pod.namespace=default").unwrap());
        l.insert(Label::parse("k8s:app=web").unwrap());
        assert_eq!(l.as_str(), "k8s:app=web;k8s:io.kubernetes.pod.namespace=default;");
        // Reserved and CIDR labels: empty values, ':' in a key, '=' in a value.
        let l = Labels::parse("reserved:host=;cidr:10.0.0.0/8=;unspec:a:b=x=y;").unwrap();
        assert_eq!(l.as_str(), "cidr:10.0.0.0/8=;unspec:a:b=x=y;reserved:host=;");
        assert_eq!(l.get("a:b").map(Label::value), Some("x=y"));
        // One label per key: insert replaces, parse refuses a repeat.
        let mut l = Labels::parse("k8s:app=web;").unwrap();
        let old = l.insert(Label::new("container", "app", "db").unwrap());
        assert_eq!(old.map(|o| o.to_string()).as_deref(), Some("k8s:app=web"));
        assert_eq!(l.to_string(), "container:app=db;");
    }

    #[test]
    fn bad_input_is_named() {
        for (bad, names) in [
            ("k8s:app=web", "k8s:app=web"),
            ("k8sapp=web;", "k8sapp=web"),
            ("k8s:app;", "k8s:app"),
            (":app=web;", "label source"),
            ("k8s:=web;", "label key"),
            ("k8s:app=web;k8s:app=db;", "given twice"),
        ] {
            let e = Labels::parse(bad).unwrap_err().to_string();
            assert!(e.contains(names), "{bad}: {e}");
        }
        assert!(Label::new("k8s", "app", "a;b").unwrap_err().to_string().contains("no ';'"));
        assert!(Label::new("k:8s", "app", "x").is_err());
        assert_eq!(Labels::parse("").unwrap(), Labels::new());
    }

    fn label() -> impl Strategy<Value = Label> {
        ("[a-z]{1,6}", "[a-z0-9./:-]{1,12}", "[a-zA-Z0-9=._/-]{0,8}")
            .prop_map(|(s, k, v)| Label::new(s, k, v).unwrap())
    }

    proptest! {
        #[test]
        fn parse_and_render_round_trip(labels in proptest::collection::vec(label(), 0..8)) {
            let mut set = Labels::new();
            for l in labels.iter().rev() {
                set.insert(l.clone());
            }
            let rendered = set.to_string();
            let back = Labels::parse(&rendered).unwrap();
            prop_assert_eq!(&back, &set);
            prop_assert_eq!(back.as_str(), rendered.as_str());
            // Sorted by key, one `;`-ended label each, whatever the insertion order.
            let keys: Vec<&str> = back.iter().map(Label::key).collect();
            prop_assert!(keys.windows(2).all(|w| w[0] < w[1]));
            prop_assert_eq!(rendered.matches(';').count(), set.len());
            let mut other = Labels::new();
            for l in set.iter().rev() {
                other.insert(l.clone());
            }
            prop_assert_eq!(other.as_str(), rendered.as_str());
        }
    }
}
