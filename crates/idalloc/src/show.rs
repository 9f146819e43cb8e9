//! How an offending value is shown in messages: quoted, escaped, truncated. A leaf module, shared
//! by the error type and the pool spec's rendering.

/// How many bytes of an offending value an error message shows. Keys may be 4 KiB; a log line with the
/// whole key would drown the message, and the first 80 bytes are enough to recognise it.
pub const SHOWN_VALUE_BYTES: usize = 80;

/// Renders a string value for an error message: Rust-quoted (so control characters and quotes are
/// visible and unambiguous), cut to at most [`SHOWN_VALUE_BYTES`] bytes on a character boundary, and
/// followed by its length in bytes when cut, because "too long" errors are about that length.
pub fn show_value(value: &str) -> String {
    if value.len() <= SHOWN_VALUE_BYTES {
        return format!("{value:?}");
    }
    let mut end = SHOWN_VALUE_BYTES;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}… ({} bytes)", &value[..end], value.len())
}
