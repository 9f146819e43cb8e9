//! `idalloc list POOL`: the pool's bindings printed as they are read, a page at a time
//! ([`idalloc::Pool::list_each`]), so the command holds a page and not the pool. The output is the
//! one documented (docs/cli.md): the table `ID  KEY  HOLDERS` in ID
//! order, or one JSON document `{"pool":…,"bindings":[…]}`, printed a binding at a time. The
//! table's columns are aligned within each block of [`BLOCK`] rows, since the widest key of the
//! whole pool is not known before the end; a pool of up to [`BLOCK`] bindings prints exactly as
//! before. An error midway ends the command with its message and a non-zero exit after what was
//! already printed, which is then partial (a JSON document cut short does not parse).

use std::io::Write;

use idalloc::{Binding, Pool};

use crate::commands::Out;
use crate::fail::Failure;
use crate::render;

/// Rows per aligned block of the text table.
pub const BLOCK: usize = 1000;

/// Prints every binding of `pool` (named `name`) to stdout.
pub async fn print(pool: &Pool, name: &str, out: Out) -> Result<u8, Failure> {
    let mut p = Printer::new(out.json, name);
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

/// The output being written.
struct Printer {
    json: bool,
    w: std::io::BufWriter<std::io::Stdout>,
    /// Text: the rows of the block not yet printed.
    rows: Vec<Vec<String>>,
    /// Text: whether the header went out (with the first block).
    header: bool,
    /// JSON: the start and the end of the document; and whether a binding was written (commas).
    head: String,
    tail: String,
    any: bool,
}

fn write_failed(e: std::io::Error) -> Failure {
    Failure::runtime(format!("writing to stdout: {e}"))
}

impl Printer {
    fn new(json: bool, pool: &str) -> Self {
        let (head, tail) = render::bindings_json_frame(pool);
        Printer {
            json,
            w: std::io::BufWriter::new(std::io::stdout()),
            rows: Vec::new(),
            header: false,
            head,
            tail,
            any: false,
        }
    }

    fn start(&mut self) -> Result<(), Failure> {
        if self.json {
            self.w.write_all(self.head.as_bytes()).map_err(write_failed)?;
        }
        Ok(())
    }

    fn page(&mut self, page: &[Binding]) -> Result<(), Failure> {
        if self.json {
            for b in page {
                if self.any {
                    self.w.write_all(b",").map_err(write_failed)?;
                }
                self.any = true;
                serde_json::to_writer(&mut self.w, &render::binding_json(b))
                    .map_err(|e| Failure::runtime(format!("writing to stdout: {e}")))?;
            }
            return Ok(());
        }
        self.rows.extend(render::bindings_rows(page));
        if self.rows.len() >= BLOCK {
            self.block()?;
        }
        Ok(())
    }

    /// Text: prints the pending rows as one aligned block (the header with the first).
    fn block(&mut self) -> Result<(), Failure> {
        let t = render::table_block(&render::BINDINGS_HEADER, &self.rows, !self.header);
        self.header = true;
        self.rows.clear();
        self.w.write_all(t.as_bytes()).and_then(|_| self.w.flush()).map_err(write_failed)
    }

    fn finish(&mut self) -> Result<(), Failure> {
        if self.json {
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
