//! The runner of the guide's examples (`tests/docs_examples.rs`): the Markdown side
//! ([`markdown`]: which blocks are commands, with what output) and the comparison of an output
//! with the page's ([`expect`]: the one place that says what may differ). Both are pure; the test
//! file runs the commands.

pub mod expect;
pub mod markdown;
