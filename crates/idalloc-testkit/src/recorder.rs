//! A `metrics` recorder for tests: counters and gauges kept in memory, read back by name and
//! labels, so a test can check that the library's metrics move (the library records through the
//! `metrics` facade and installs nothing itself).
//!
//! A process has one global recorder: install it once per test binary ([`TestRecorder::global`])
//! and tell tests apart by their labels (a pool or remote name of their own). Histograms are not
//! kept.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

/// A metric's name and its labels, sorted.
type Id = (String, Vec<(String, String)>);

/// The in-memory recorder. Cheap to clone (shared state).
#[derive(Clone, Default)]
pub struct TestRecorder {
    counters: Arc<Mutex<BTreeMap<Id, Arc<AtomicU64>>>>,
    /// Gauges as `f64` bits (the facade's `GaugeFn` for `AtomicU64`).
    gauges: Arc<Mutex<BTreeMap<Id, Arc<AtomicU64>>>>,
}

fn id_of(key: &Key) -> Id {
    let mut labels: Vec<(String, String)> =
        key.labels().map(|l| (l.key().to_string(), l.value().to_string())).collect();
    labels.sort();
    (key.name().to_string(), labels)
}

fn id(name: &str, labels: &[(&str, &str)]) -> Id {
    let mut l: Vec<(String, String)> =
        labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    l.sort();
    (name.to_string(), l)
}

fn handle(map: &Mutex<BTreeMap<Id, Arc<AtomicU64>>>, key: &Key) -> Arc<AtomicU64> {
    let mut m = map.lock().unwrap_or_else(|p| p.into_inner());
    m.entry(id_of(key)).or_default().clone()
}

impl TestRecorder {
    /// The process's recorder, installed as the global one on first use. Panics if another
    /// global recorder was installed first (a test binary mixing recorders is a bug).
    pub fn global() -> TestRecorder {
        static GLOBAL: OnceLock<TestRecorder> = OnceLock::new();
        GLOBAL
            .get_or_init(|| {
                let r = TestRecorder::default();
                metrics::set_global_recorder(r.clone())
                    .unwrap_or_else(|_| panic!("another metrics recorder is installed"));
                r
            })
            .clone()
    }

    /// The counter `name` with exactly these labels, if it was ever registered.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> Option<u64> {
        let m = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&id(name, labels)).map(|c| c.load(Ordering::Relaxed))
    }

    /// The gauge `name` with exactly these labels, if it was ever registered.
    pub fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let m = self.gauges.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&id(name, labels)).map(|g| f64::from_bits(g.load(Ordering::Relaxed)))
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(handle(&self.counters, key))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(handle(&self.gauges, key))
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}
