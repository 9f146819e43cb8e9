//! `idalloc list POOL`: the pool's bindings printed as they are read, a page at a time
//! ([`idalloc::Pool::list_each`]), so the command holds a page and not the pool. The output is the
//! one documented (docs/guide/cli.md): the table `ID  KEY  HOLDERS` in ID
//! order (`-o wide`: `ID  HEX  KEY  REFS  LEASED  HOLDERS`), one name a line (`-o name`), or one
//! JSON (or YAML) document `{"pool":…,"bindings":[…]}`, printed a binding at a time. The
//! table's columns are aligned within each block of [`BLOCK`] rows, since the widest key of the
//! whole pool is not known before the end; a pool of up to [`BLOCK`] bindings prints exactly as
//! before. An error midway ends the command with its message and a non-zero exit after what was
//! already printed, which is then partial (a JSON document cut short does not parse).

use std::io::Write;

use idalloc::{Binding, Pool};

use crate::cli::Format;
use crate::commands::Out;
use crate::fail::Failure;
use crate::render;

/// Rows per aligned block of the text table.
pub const BLOCK: usize = 1000;

/// Which bindings `list` prints (`--holder`, `--key-prefix`).
#[derive(Debug, Default, Clone)]
pub struct Filter {
    pub holder: Option<String>,
    pub key_prefix: Option<String>,
}

impl Filter {
    pub fn of(a: &crate::cli::ListArgs) -> Filter {
        Filter { holder: a.holder.clone(), key_prefix: a.key_prefix.clone() }
    }

    /// Whether `b` is printed.
    pub fn keeps(&self, b: &Binding) -> bool {
        self.holder.as_ref().is_none_or(|h| b.holders.iter().any(|x| x == h))
            && self.key_prefix.as_ref().is_none_or(|p| b.key.starts_with(p.as_str()))
    }
}

/// Prints every binding of `pool` (named `name`) that `filter` keeps to stdout.
pub async fn print(pool: &Pool, name: &str, filter: &Filter, out: Out) -> Result<u8, Failure> {
    let mut p = Printer::new(out, name, filter.clone());
    p.start()?;
    let listed = pool.list_each(|page| p.page(page)).await;
    match listed {
        Ok(_) => {
            p.finish()?;
            Ok(0)
        }
        Err(e) => {
            // What was printed stays printed (partial); the error line says why it stopped.
            let _ = p.w.flush();
            Err(e)
        }
    }
}

/// Prints `bindings` (all of a pool named `name`, in ID order, read by the caller: the listing of
/// `idalloc serve`) exactly as [`print`] prints a store's pool.
pub async fn print_all(
    bindings: &[Binding],
    name: &str,
    filter: &Filter,
    out: Out,
) -> Result<u8, Failure> {
    let mut p = Printer::new(out, name, filter.clone());
    p.start()?;
    for page in bindings.chunks(BLOCK) {
        p.page(page)?;
    }
    p.finish()?;
    Ok(0)
}

/// The output being written.
struct Printer {
    format: Format,
    /// `--no-headers`: the text table without its header line.
    no_headers: bool,
    filter: Filter,
    w: std::io::BufWriter<std::io::Stdout>,
    /// Text: the rows of the block not yet printed.
    rows: Vec<Vec<String>>,
    /// Text: whether the header went out (with the first block).
    header: bool,
    /// JSON, YAML: the start and the end of the document; and whether a binding was written
    /// (JSON: commas; YAML: the `bindings:` line or ` []`).
    head: String,
    tail: String,
    any: bool,
}

fn write_failed(e: std::io::Error) -> Failure {
    crate::fail::stdout_error(e)
}

impl Printer {
    fn new(out: Out, pool: &str, filter: Filter) -> Self {
        let (head, tail) = match out.format {
            Format::Yaml => render::bindings_yaml_frame(pool),
            _ => render::bindings_json_frame(pool),
        };
        Printer {
            format: out.format,
            no_headers: out.no_headers,
            filter,
            w: std::io::BufWriter::new(std::io::stdout()),
            rows: Vec::new(),
            header: false,
            head,
            tail,
            any: false,
        }
    }

    fn start(&mut self) -> Result<(), Failure> {
        if matches!(self.format, Format::Json | Format::Yaml) {
            self.w.write_all(self.head.as_bytes()).map_err(write_failed)?;
        }
        Ok(())
    }

    fn page(&mut self, page: &[Binding]) -> Result<(), Failure> {
        let kept: Vec<Binding>;
        let page = if self.filter.holder.is_none() && self.filter.key_prefix.is_none() {
            page
        } else {
            kept = page.iter().filter(|b| self.filter.keeps(b)).cloned().collect();
            &kept
        };
        if self.format == Format::Yaml {
            for b in page {
                if !self.any {
                    self.w.write_all(b"\n").map_err(write_failed)?;
                }
                self.any = true;
                self.w.write_all(render::binding_yaml(b).as_bytes()).map_err(write_failed)?;
            }
            return Ok(());
        }
        if self.format == Format::Name {
            for b in page {
                self.w
                    .write_all(format!("{}\n", render::text(&b.key)).as_bytes())
                    .map_err(write_failed)?;
            }
            return Ok(());
        }
        if self.format == Format::Json {
            for b in page {
                if self.any {
                    self.w.write_all(b",").map_err(write_failed)?;
                }
                self.any = true;
                serde_json::to_writer(&mut self.w, &render::binding_json(b))
                    .map_err(|e| write_failed(std::io::Error::from(e)))?;
            }
            return Ok(());
        }
        if self.format == Format::Wide {
            self.rows.extend(render::bindings_rows_wide(page));
        } else {
            self.rows.extend(render::bindings_rows(page));
        }
        if self.rows.len() >= BLOCK {
            self.block()?;
        }
        Ok(())
    }

    /// Text: prints the pending rows as one aligned block (the header with the first).
    fn block(&mut self) -> Result<(), Failure> {
        let header: &[&str] = if self.format == Format::Wide {
            &render::BINDINGS_WIDE_HEADER
        } else {
            &render::BINDINGS_HEADER
        };
        let t = render::table_block(header, &self.rows, !self.header && !self.no_headers);
        self.header = true;
        self.rows.clear();
        self.w.write_all(t.as_bytes()).and_then(|_| self.w.flush()).map_err(write_failed)
    }

    fn finish(&mut self) -> Result<(), Failure> {
        if self.format == Format::Yaml {
            let tail = format!("{}{}", if self.any { "" } else { " []\n" }, self.tail);
            return self
                .w
                .write_all(tail.as_bytes())
                .and_then(|_| self.w.flush())
                .map_err(write_failed);
        }
        if self.format == Format::Name {
            return self.w.flush().map_err(write_failed);
        }
        if self.format == Format::Json {
            let tail = format!("{}\n", self.tail);
            return self
                .w
                .write_all(tail.as_bytes())
                .and_then(|_| self.w.flush())
                .map_err(write_failed);
        }
        if !self.rows.is_empty() || !self.header {
            self.block()?;
        }
        Ok(())
    }
}
