//! Running each command: open the store, call the allocator, print the result.

use std::io::Write;
use std::sync::Arc;

use idalloc::layout::Layout;
use idalloc::pool::parse_id_list;
use idalloc::store::{GetRequest, KeyRange, OpResponse, Store, TxnOp, TxnRequest};
use idalloc::{Allocator, PoolSpec, Strategy};
use serde_json::{json, Value};

use crate::cli::{
    AcquireArgs, CheckArgs, Cli, Command, CreateArgs, DeleteArgs, Format, GcArgs, GetArgs,
    LookupArgs, ManArgs, PoolCommand, ReleaseArgs, ResizeArgs, StrategyArg, UpgradeCommand,
};
use crate::fail::Failure;
use crate::open::{self, Settings};
use crate::parse::default_holder;
use crate::render::{self, Usage};
use crate::{batch, docgen, remotes, watch};

/// Where results go: stdout, in the format of `-o`.
#[derive(Clone, Copy)]
pub struct Out {
    pub format: Format,
    /// Tables without their header line (`--no-headers`).
    pub no_headers: bool,
}

impl Out {
    /// Text output with headers (commands whose output has no format).
    pub fn plain() -> Out {
        Out { format: Format::Text, no_headers: false }
    }

    /// Text with more columns (`-o wide`).
    pub fn is_wide(&self) -> bool {
        self.format == Format::Wide
    }

    /// The structured form of a result `v` in the format (`None` for the text formats, whose
    /// caller writes its text): a JSON line; a YAML document that starts with `---`, so that
    /// the documents of a stream (watch, --from) stay apart; or the names in `v`, one a line.
    pub fn doc(&self, v: &Value) -> Option<String> {
        match self.format {
            Format::Json => Some(format!("{v}\n")),
            Format::Yaml => Some(crate::render::yaml_doc(v)),
            Format::Name => Some(
                crate::render::names(v).iter().map(|n| format!("{}\n", render::text(n))).collect(),
            ),
            Format::Text | Format::Wide => None,
        }
    }

    /// Writes `text` (which ends with a newline) to stdout. A closed stdout (`| head`) ends the
    /// command quietly with exit 141 (`fail::stdout_error`), never a panic.
    pub fn text(&self, text: &str) -> Result<(), Failure> {
        let mut o = std::io::stdout().lock();
        o.write_all(text.as_bytes()).and_then(|_| o.flush()).map_err(crate::fail::stdout_error)
    }

    /// Writes raw bytes (a generated script or page) to stdout; exit 0.
    pub fn bytes(&self, b: &[u8]) -> Result<u8, Failure> {
        let mut o = std::io::stdout().lock();
        o.write_all(b).and_then(|_| o.flush()).map(|_| 0).map_err(crate::fail::stdout_error)
    }

    /// The structured form of `v` ([`Out::doc`]) in a structured format, else the text.
    pub fn either(
        &self,
        v: impl FnOnce() -> Value,
        text: impl FnOnce() -> String,
    ) -> Result<(), Failure> {
        match self.doc(&v()) {
            Some(d) => self.text(&d),
            None => self.text(&text()),
        }
    }
}

/// Runs the parsed command line; returns the exit code on success paths that are not 0 (status).
pub async fn run(cli: Cli) -> Result<u8, Failure> {
    // Completions and man pages come from the command definitions alone: no store, no
    // credentials, no prompt.
    match &cli.command {
        Command::Completions(a) => return Out::plain().bytes(&docgen::completions(a.shell)),
        Command::Man(ManArgs { dir: Some(dir) }) => return docgen::man_pages_to(dir).map(|_| 0),
        Command::Man(ManArgs { dir: None }) => return Out::plain().bytes(&docgen::man_page()?),
        Command::Options => return Out::plain().text(&docgen::options()).map(|_| 0),
        _ => {}
    }
    let out = Out { format: cli.format()?, no_headers: cli.no_headers };
    if out.format == Format::Name && !names_things(&cli.command) {
        return Err(Failure::usage(
            "-o name prints pool or key names, and this command prints neither: use -o text, \
             wide, json or yaml",
        ));
    }
    // The client's versions need no store; the store's server only when one is named.
    let store_named =
        cli.store.is_some() || cli.etcd.endpoints.is_some() || cli.etcd.etcd_config.is_some();
    if matches!(cli.command, Command::Version) && !store_named {
        return crate::version::print(None, out);
    }
    // Through `idalloc serve`: no store is opened, no etcd credentials are asked for.
    if let Some(endpoints) = &cli.server {
        return crate::through::run(&cli, endpoints).await;
    }
    // Which store and how to reach it (etcd flags, config file, URL credentials); a password
    // prompt, if any, happens here, before anything else.
    let (url, etcd) = crate::connect::resolve_here(cli.store.clone(), &cli.etcd)?;
    let settings = Settings {
        url,
        etcd,
        prefix: cli.prefix.clone(),
        timeout: cli.timeout,
        lock_timeout: cli.lock_timeout.unwrap_or(cli.timeout * 6),
        check_file: matches!(cli.command, Command::Check(_)),
    };
    crate::unanswered::remember(&settings);
    // Validate the prefix before touching any store, so a typo never creates a file.
    let layout =
        Layout::new(&settings.prefix).map_err(|e| Failure::usage(format!("--prefix: {e}")))?;
    let writes = !matches!(
        cli.command,
        Command::Get(_)
            | Command::Lookup(_)
            | Command::List(_)
            | Command::Watch(_)
            | Command::Status
            | Command::Version
            | Command::Upgrade(UpgradeCommand::Status)
            | Command::Complete(_)
            | Command::Pool(PoolCommand::List | PoolCommand::Show(_))
            | Command::Gc(GcArgs { dry_run: true, .. })
            | Command::Check(CheckArgs { repair: false, .. })
    );
    if let Command::Serve(a) = &cli.command {
        return crate::serve::run(&settings, a, cli.log_format == crate::cli::LogFormat::Json)
            .await;
    }
    if let Command::Watch(w) = &cli.command {
        if let crate::parse::StoreUrl::File(_) = settings.url {
            if w.remote.any() {
                return Err(Failure::usage(
                    "watch --remote follows the local pool's events and so needs an etcd:// (or memory:) --store; \
                     a file store is only polled (use get, lookup or list with --remote on a file store)",
                ));
            }
            return watch::poll_file(&settings, w, out).await.map(|_| 0);
        }
    }
    let opened = match open::open_store(&settings, writes).await {
        Ok(o) => o,
        // `status` prints what it knows also when the store cannot be opened (a file another
        // process holds, an etcd that does not answer), then exits with the failure's code.
        // A damaged file (exit 4) or a bad command line (2) stays the one error line.
        Err(f) if matches!(cli.command, Command::Status) && f.code == crate::fail::UNAVAILABLE => {
            let report = StatusReport {
                kind: settings.url.kind(),
                endpoint: settings.url.endpoint(),
                prefix: settings.prefix.clone(),
                revision: None,
                pools: None,
                broken: Vec::new(),
                error: Some(f.message.clone()),
                reachable: false,
            };
            report.print(out)?;
            return Ok(f.code);
        }
        Err(f) => return Err(f),
    };
    let store = opened.store.clone();
    if matches!(cli.command, Command::Version) {
        return crate::version::with_store(&settings, &*store, opened.file_missing, out).await;
    }
    // Refuse a prefix nested with another deployment's before touching anything; `status` and
    // `check` report it instead.
    if !matches!(cli.command, Command::Status | Command::Check(_)) {
        if let Some(first) = nesting(&settings, &*store, &layout).await?.first() {
            return Err(Failure::usage(format!(
                "--prefix: {first}; deployments sharing a store need prefixes that do not lie \
                 inside one another"
            )));
        }
    }
    let bulk = match &cli.command {
        Command::Acquire(a) => usize::from(a.concurrency),
        Command::Release(a) => usize::from(a.concurrency),
        _ => idalloc::allocator::DEFAULT_BULK_IN_FLIGHT,
    };
    let alloc = open::allocator(&settings, store.clone(), one_key(&cli.command), bulk)?;
    let result = dispatch(&cli, &settings, &layout, &alloc, store, opened.file_missing, out).await;
    let result = match result {
        Err(f) if f.code == crate::fail::NOT_FOUND => {
            let names = alloc
                .pool_listing()
                .await
                .map(|l| l.pools.iter().map(|s| s.name().to_string()).collect::<Vec<_>>());
            Err(suggest_pool(&cli.command, f, names.ok()))
        }
        r => r,
    };
    // Closing revokes nothing (the CLI holds no lease) but stops background work at once, so the
    // store file is released before the process exits.
    let _ = alloc.close().await;
    result
}

/// Whether the command's results have pool or key names for `-o name`.
fn names_things(command: &Command) -> bool {
    !matches!(
        command,
        Command::Check(_)
            | Command::Gc(_)
            | Command::Version
            | Command::Serve(_)
            | Command::Upgrade(_)
            | Command::Completions(_)
            | Command::Man(_)
            | Command::Options
    )
}

/// The pool a command names, if it names one.
pub fn named_pool(command: &Command) -> Option<&str> {
    match command {
        Command::Pool(PoolCommand::Show(p)) => Some(&p.pool),
        Command::Pool(PoolCommand::Delete(a)) => Some(&a.name),
        Command::Pool(PoolCommand::Resize(a)) => Some(&a.name),
        Command::Acquire(a) => Some(&a.pool),
        Command::Release(a) => Some(&a.pool),
        Command::Get(a) => Some(&a.pool),
        Command::Lookup(a) => Some(&a.pool),
        Command::List(a) => Some(&a.pool),
        Command::Watch(a) => Some(&a.pool),
        Command::Gc(a) => a.pool.as_deref(),
        Command::Check(a) => a.pool.as_deref(),
        _ => None,
    }
}

/// A "not found" failure with the closest existing pool appended when the pool the command names
/// is the one missing (`pool "vnii" not found…; did you mean "vni"?`). `names`: the pools, if
/// they could be listed (if not, the failure is left as it is).
pub fn suggest_pool(command: &Command, f: Failure, names: Option<Vec<String>>) -> Failure {
    let (Some(missing), Some(names)) = (named_pool(command), names) else { return f };
    if names.iter().any(|n| n == missing) {
        // The pool is there: the key or ID is what was not found.
        return f;
    }
    Failure { message: crate::suggest::pool_message(&f.message, missing, &names), ..f }
}

/// Commands that open their pool lazily, never listing it unless they need to
/// (docs/design/lazy-binds.md): those that touch one key or ID, `list` (which streams the
/// store's records, not the view), `gc` (which reads the records it sweeps), and `acquire --from`, whose
/// batches guess candidates in a `random` pool as a lone acquire does (so its memory does not
/// grow with the pool it fills; a `lowest` pool still loads the view). `release --from` and
/// `--remote` reads keep the listed view, which they use (a lazy `release --from` would read
/// every key's record, one round trip each).
fn one_key(command: &Command) -> bool {
    match command {
        Command::Acquire(_) => true,
        Command::Release(a) => a.from.is_none(),
        Command::Get(a) => !a.remote.any(),
        Command::Lookup(a) => !a.remote.any(),
        // `list` reads the store page by page and never uses the view.
        Command::List(a) => !a.remote.any(),
        // A sweep reads the pool's records itself and decides from them alone; a listed view
        // would be a second whole read of the pool, running beside it for nothing (half of
        // `gc`'s CPU at 1M bindings; docs/benchmarks/scale.md, "Linear cost").
        Command::Gc(_) => true,
        _ => false,
    }
}

async fn dispatch(
    cli: &Cli,
    settings: &Settings,
    layout: &Layout,
    alloc: &Allocator,
    store: Arc<dyn Store>,
    file_missing: bool,
    out: Out,
) -> Result<u8, Failure> {
    match &cli.command {
        Command::Pool(PoolCommand::Create(a)) => pool_create(alloc, a, out).await,
        Command::Pool(PoolCommand::List) => {
            let listing = alloc.pool_listing().await?;
            let mut usages = Vec::with_capacity(listing.pools.len());
            for spec in listing.pools {
                usages.push(usage(&*store, layout, spec).await?);
            }
            crate::print::pools(&usages, &listing.broken, out)?;
            warn_broken(&listing.broken);
            Ok(0)
        }
        Command::Pool(PoolCommand::Show(p)) => {
            let pool = alloc.pool(&p.pool).await?;
            let u = usage(&*store, layout, pool.spec()).await?;
            crate::print::pool(&u, out)?;
            Ok(0)
        }
        Command::Pool(PoolCommand::Delete(a)) => pool_delete(alloc, a, out).await,
        Command::Pool(PoolCommand::Resize(a)) => {
            let reserved = resize_reserved(a)?;
            let spec =
                alloc.resize_pool(&a.name, a.range.min, a.range.max, reserved.as_deref()).await?;
            crate::print::pool_resized(&spec, out)?;
            Ok(0)
        }
        Command::Acquire(a) => acquire(alloc, a, out).await,
        Command::Release(a) => release(alloc, a, out).await,
        Command::Get(a) if a.remote.any() => {
            idalloc::pool::validate_key(&a.key)?;
            let pool = alloc.pool(&a.pool).await?;
            remotes::get(settings, &pool, &a.key, &a.remote, out).await
        }
        Command::Lookup(a) if a.remote.any() => {
            let pool = alloc.pool(&a.pool).await?;
            remotes::lookup(settings, &pool, a.id, &a.remote, out).await
        }
        Command::List(p) if p.remote.any() => {
            let pool = alloc.pool(&p.pool).await?;
            remotes::list(settings, &pool, &p.remote, out).await
        }
        Command::Watch(w) if w.remote.any() => {
            let pool = alloc.pool(&w.pool).await?;
            remotes::watch(settings, &pool, &w.remote, w.count, out).await
        }
        Command::Get(a) => get(alloc, a, out).await,
        Command::Lookup(a) => lookup(alloc, a, out).await,
        Command::List(p) => {
            let pool = alloc.pool(&p.pool).await?;
            crate::list::print(&pool, &p.pool, &crate::list::Filter::of(p), out).await
        }
        Command::Watch(w) => watch::follow(alloc, w, out).await.map(|_| 0),
        Command::Gc(a) => gc(alloc, a, out).await,
        Command::Status => status(settings, layout, alloc, &*store, file_missing, out).await,
        Command::Check(a) => check(settings, layout, &*store, a, out).await,
        Command::Upgrade(u) => crate::upgrade::run(u, layout, &*store, out).await,
        Command::Complete(_) => {
            let listing = alloc.pool_listing().await?;
            crate::print::completions(listing.pools.iter().map(|s| s.name()))
        }
        Command::Serve(_) => Err(Failure::usage("serve is run before a store is opened")),
        Command::Completions(_) | Command::Man(_) | Command::Version | Command::Options => {
            Err(Failure::usage("completions, man and version are run before the allocator opens"))
        }
    }
}

/// The nesting probe with the command's bounds: up to 3 attempts of a third of `--timeout`.
async fn nesting(
    settings: &Settings,
    store: &dyn Store,
    layout: &Layout,
) -> Result<Vec<String>, Failure> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let r = tokio::time::timeout(
            settings.attempt_timeout(),
            idalloc::check::nesting(store, layout),
        )
        .await
        .unwrap_or_else(|_| {
            Err(idalloc::store::StoreError::Unavailable(format!(
                "no answer within {:?}",
                settings.attempt_timeout()
            )))
        });
        match r {
            Err(e) if e.is_retryable() && attempt < 3 => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
            other => return other.map_err(|e| idalloc::Error::from(e).into()),
        }
    }
}

async fn check(
    settings: &Settings,
    layout: &Layout,
    store: &dyn Store,
    a: &CheckArgs,
    out: Out,
) -> Result<u8, Failure> {
    use idalloc::check;
    if let Some(p) = &a.pool {
        idalloc::pool::validate_pool_name(p)?;
    }
    let page = idalloc::AllocatorOptions::default().list_page;
    let nested = nesting(settings, store, layout).await?;
    let scan_once = || async {
        let mut s = check::scan(store, layout, a.pool.as_deref(), page)
            .await
            .map_err(idalloc::Error::from)?;
        s.report.other.extend(
            nested.iter().map(|m| idalloc::audit::Finding::NestedPrefix { message: m.clone() }),
        );
        Ok::<_, Failure>(s)
    };
    let first = scan_once().await?;
    if !a.repair {
        out.either(|| render::check_json(&first.report), || render::check_text(&first.report))?;
        return Ok(if first.report.breaches() == 0 { 0 } else { crate::fail::RUNTIME });
    }
    let repairs = check::repair(store, layout, &first).await.map_err(idalloc::Error::from)?;
    let after = scan_once().await?;
    out.either(
        || {
            json!({"revision": first.report.revision, "breaches": first.report.breaches(),
                   "repairs": repairs.iter().map(render::repair_json).collect::<Vec<_>>(),
                   "after": render::check_json(&after.report)})
        },
        || {
            let mut t = render::repairs_text(&repairs);
            t.push_str("after repair: ");
            t.push_str(&render::check_text(&after.report));
            t
        },
    )?;
    Ok(if after.report.breaches() == 0 { 0 } else { crate::fail::RUNTIME })
}

pub fn holder_of(h: &Option<String>) -> String {
    h.clone().unwrap_or_else(|| {
        default_holder(std::env::var("USER").ok(), std::env::var("LOGNAME").ok())
    })
}

async fn pool_create(alloc: &Allocator, a: &CreateArgs, out: Out) -> Result<u8, Failure> {
    let spec = build_spec(a)?;
    alloc.init_pool(&spec).await?;
    crate::print::pool_ready(&spec, out)?;
    Ok(0)
}

pub fn build_spec(a: &CreateArgs) -> Result<PoolSpec, Failure> {
    let mut spec = PoolSpec::new(a.name.clone(), a.range.min, a.range.max)
        .strategy(match a.strategy {
            StrategyArg::Random => Strategy::Random,
            StrategyArg::Lowest => Strategy::Lowest,
        })
        .idle_grace(a.idle_grace)
        .reuse_delay(a.reuse_delay);
    if let Some(list) = &a.reserve {
        spec = spec.reserve_all(
            &parse_id_list(list).map_err(|e| Failure::usage(format!("--reserve: {e}")))?,
        );
    }
    if let Some(bits) = a.prefix_bits {
        spec = spec.prefix(bits);
    }
    spec.validate()?;
    Ok(spec)
}

/// `pool resize --reserve LIST`, parsed (`''`: none).
pub fn resize_reserved(a: &ResizeArgs) -> Result<Option<Vec<(u64, u64)>>, Failure> {
    match a.reserve.as_deref().map(str::trim) {
        None => Ok(None),
        Some("") => Ok(Some(Vec::new())),
        Some(list) => {
            parse_id_list(list).map(Some).map_err(|e| Failure::usage(format!("--reserve: {e}")))
        }
    }
}

/// What `pool resize` prints: the spec now in force (as `pool create` shows it).
async fn pool_delete(alloc: &Allocator, a: &DeleteArgs, out: Out) -> Result<u8, Failure> {
    if !alloc.delete_pool(&a.name, a.force).await? {
        return Err(Failure::not_found(format!("pool {:?} not found", a.name)));
    }
    crate::print::pool_deleted(&a.name, out)?;
    Ok(0)
}

async fn acquire(alloc: &Allocator, a: &AcquireArgs, out: Out) -> Result<u8, Failure> {
    let holder = holder_of(&a.holder);
    idalloc::pool::validate_durable_holder(&holder)
        .map_err(|e| Failure::usage(format!("--holder: {e}")))?;
    let pool = match a.range {
        Some(r) => alloc.ensure_pool(&PoolSpec::new(a.pool.clone(), r.min, r.max)).await?,
        None => alloc.pool(&a.pool).await?,
    };
    if let Some(from) = &a.from {
        return batch::acquire_from(&pool, from, &holder, a.concurrency.into(), out)
            .await
            .map(|_| 0);
    }
    // clap guarantees KEY when --from is absent.
    let key = a.key.as_deref().unwrap_or_default();
    let got = pool.acquire_durable(key, &holder).await?;
    crate::print::acquired(&a.pool, key, &got, &holder, out)?;
    Ok(0)
}

async fn release(alloc: &Allocator, a: &ReleaseArgs, out: Out) -> Result<u8, Failure> {
    let holder = holder_of(&a.holder);
    idalloc::pool::validate_durable_holder(&holder)
        .map_err(|e| Failure::usage(format!("--holder: {e}")))?;
    if let Some(from) = &a.from {
        // A pool that does not exist holds nothing: every key is a no-op, as below.
        let pool = match alloc.pool(&a.pool).await {
            Ok(p) => Some(p),
            Err(idalloc::Error::PoolNotFound { .. }) => None,
            Err(e) => return Err(e.into()),
        };
        return batch::release_from(
            pool.as_ref(),
            &a.pool,
            from,
            &holder,
            a.concurrency.into(),
            out,
        )
        .await
        .map(|_| 0);
    }
    // clap guarantees KEY when --from is absent.
    let key = a.key.as_deref().unwrap_or_default();
    idalloc::pool::validate_key(key)?;
    // A pool that does not exist holds nothing: a no-op, like any release of what is not held.
    let r = alloc.release_durable(&a.pool, key, &holder).await?;
    crate::print::released(&a.pool, key, &holder, r, out)?;
    Ok(0)
}

async fn get(alloc: &Allocator, a: &GetArgs, out: Out) -> Result<u8, Failure> {
    idalloc::pool::validate_key(&a.key)?;
    let pool = alloc.pool(&a.pool).await?;
    crate::print::id_of(&a.pool, &a.key, pool.get_consistent(&a.key).await?, out)
}

async fn lookup(alloc: &Allocator, a: &LookupArgs, out: Out) -> Result<u8, Failure> {
    let pool = alloc.pool(&a.pool).await?;
    crate::print::key_of(&a.pool, a.id, pool.key_of_consistent(a.id).await?, out)
}

/// One `warning: ` line on stderr per spec record that cannot be used, so text output stays
/// clean for scripts and the problem is still seen.
fn warn_broken(broken: &[idalloc::records::SpecProblem]) {
    for p in broken {
        crate::fail::say(&format!(
            "warning: {}; run `idalloc check` for details",
            render::controls(&p.to_string())
        ));
    }
}

async fn gc(alloc: &Allocator, a: &GcArgs, out: Out) -> Result<u8, Failure> {
    if let Some(holder) = &a.holder {
        return gc_holder(alloc, a, holder, out).await;
    }
    // All pools: one broken spec is reported and skipped, the others are swept (exit 1 at the
    // end, since the broken pool's bindings were not looked at).
    let (names, broken) = gc_pools(alloc, a).await?;
    let mut reports = Vec::new();
    for name in &names {
        let pool = alloc.pool(name).await?;
        let r = if a.dry_run { pool.sweep_dry_run().await? } else { pool.sweep().await? };
        reports.push((name.clone(), r));
    }
    out.either(
        || {
            json!({"dry_run": a.dry_run,
                   "pools": reports.iter().map(|(n, r)| render::sweep_json(n, r)).collect::<Vec<_>>(),
                   "broken": render::broken_json(&broken)})
        },
        || {
            if reports.is_empty() && broken.is_empty() {
                "no pools\n".to_string()
            } else {
                reports.iter().map(|(n, r)| render::sweep_text(n, r, a.dry_run)).collect()
            }
        },
    )?;
    warn_broken(&broken);
    Ok(if broken.is_empty() { 0 } else { crate::fail::RUNTIME })
}

/// The pools `gc` visits: the one named, or every pool with a readable spec (the others are
/// returned to be reported).
async fn gc_pools(
    alloc: &Allocator,
    a: &GcArgs,
) -> Result<(Vec<String>, Vec<idalloc::records::SpecProblem>), Failure> {
    Ok(match &a.pool {
        Some(p) => (vec![p.clone()], Vec::new()),
        None => {
            let listing = alloc.pool_listing().await?;
            (listing.pools.iter().map(|s| s.name().to_string()).collect(), listing.broken)
        }
    })
}

/// `gc --holder`: every durable reference of `holder` released, in one pool or all.
async fn gc_holder(alloc: &Allocator, a: &GcArgs, holder: &str, out: Out) -> Result<u8, Failure> {
    idalloc::pool::validate_durable_holder(holder)
        .map_err(|e| Failure::usage(format!("--holder: {e}")))?;
    let (names, broken) = gc_pools(alloc, a).await?;
    let mut reports = Vec::new();
    for name in &names {
        let pool = alloc.pool(name).await?;
        let dropped = crate::release_holder::on_store(&pool, holder, a.dry_run).await?;
        reports.push(crate::release_holder::PoolReport { pool: name.clone(), dropped });
    }
    crate::release_holder::print(holder, a.dry_run, &reports, out)?;
    warn_broken(&broken);
    Ok(if broken.is_empty() { 0 } else { crate::fail::RUNTIME })
}

/// Bound keys and all ID records (bound + quarantined) of a pool, counted in one txn so the two
/// figures are of the same revision.
async fn usage(store: &dyn Store, layout: &Layout, spec: PoolSpec) -> Result<Usage, Failure> {
    let name = spec.name().to_string();
    let count =
        |prefix: Vec<u8>| TxnOp::get(GetRequest::new(KeyRange::prefix(prefix)).count_only());
    let resp = store
        .txn(
            TxnRequest::new()
                .and_then([count(layout.key_prefix(&name)), count(layout.id_prefix(&name))]),
        )
        .await
        .map_err(idalloc::Error::from)?;
    let n = |i: usize| match resp.responses.get(i) {
        Some(OpResponse::Get(g)) => u64::try_from(g.count).unwrap_or(0),
        _ => 0,
    };
    let (bound, ids) = (n(0), n(1));
    Ok(Usage { spec, bound, quarantined: ids.saturating_sub(bound) })
}

async fn status(
    settings: &Settings,
    layout: &Layout,
    alloc: &Allocator,
    store: &dyn Store,
    file_missing: bool,
    out: Out,
) -> Result<u8, Failure> {
    let mut endpoint = settings.url.endpoint();
    if file_missing {
        endpoint.push_str(" (not created yet)");
    }
    let probe = tokio::time::timeout(
        settings.timeout,
        store.get(GetRequest::new(KeyRange::prefix(layout.pools_prefix())).count_only()),
    )
    .await;
    // The exit code when the store does not answer: 5 if a retry may help, else 1.
    let (revision, error, unreachable_code) = match probe {
        Ok(Ok(r)) => (Some(r.revision), None, crate::fail::OK),
        Ok(Err(e)) => {
            let code = Failure::from(idalloc::Error::from(e.clone())).code;
            (None, Some(e.to_string()), code)
        }
        Err(_) => (
            None,
            Some(format!("no answer within {:?}", settings.timeout)),
            crate::fail::UNAVAILABLE,
        ),
    };
    let reachable = error.is_none();
    // `None`: the pools could not be listed (said as such, never as "none").
    let (pools, broken, list_error) = if reachable {
        match alloc.pool_listing().await {
            Ok(l) => (
                Some(l.pools.iter().map(|s| s.name().to_string()).collect::<Vec<_>>()),
                l.broken,
                None,
            ),
            Err(e) => (None, Vec::new(), Some(e.to_string())),
        }
    } else {
        (None, Vec::new(), None)
    };
    let code = match (&error, &list_error) {
        (Some(_), _) => unreachable_code,
        (None, Some(_)) => crate::fail::RUNTIME,
        (None, None) => crate::fail::OK,
    };
    let report = StatusReport {
        kind: settings.url.kind(),
        endpoint,
        prefix: settings.prefix.clone(),
        reachable,
        revision,
        pools,
        broken,
        error: error.or(list_error),
    };
    report.print(out)?;
    warn_broken(&report.broken);
    Ok(code)
}

/// What `status` knows, printed the same way whether the store was opened or not.
pub struct StatusReport {
    pub kind: &'static str,
    pub endpoint: String,
    pub prefix: String,
    pub reachable: bool,
    pub revision: Option<i64>,
    /// `None`: the pools could not be listed (said as such, never as "none").
    pub pools: Option<Vec<String>>,
    pub broken: Vec<idalloc::records::SpecProblem>,
    pub error: Option<String>,
}

impl StatusReport {
    pub fn print(&self, out: Out) -> Result<(), Failure> {
        let broken_names: Vec<String> = self
            .broken
            .iter()
            .map(|p| p.pool.clone().unwrap_or_else(|| p.record.clone()))
            .collect();
        out.either(
            || {
                json!({"store": self.kind, "endpoint": self.endpoint, "prefix": self.prefix,
                       "reachable": self.reachable, "revision": self.revision, "pools": self.pools,
                       "broken": render::broken_json(&self.broken), "error": self.error})
            },
            || {
                let pools_line = match &self.pools {
                    None => "unknown".to_string(),
                    Some(p) if p.is_empty() && self.broken.is_empty() => "none".to_string(),
                    Some(p) => {
                        let mut parts: Vec<String> = p.clone();
                        parts.extend(
                            broken_names
                                .iter()
                                .map(|b| format!("{} (broken spec)", render::text(b))),
                        );
                        parts.join(", ")
                    }
                };
                let mut t = format!(
                    "store:      {}\nendpoint:   {}\nprefix:     {}\nreachable:  {}\nrevision:   {}\npools:      {}\n",
                    self.kind,
                    self.endpoint,
                    self.prefix,
                    if self.reachable {
                        "yes".to_string()
                    } else {
                        format!("no ({})", render::controls(self.error.as_deref().unwrap_or_default()))
                    },
                    self.revision.map_or("-".to_string(), |r| r.to_string()),
                    pools_line,
                );
                if self.reachable {
                    if let Some(e) = &self.error {
                        t.push_str(&format!("error:      {}\n", render::controls(e)));
                    }
                }
                t
            },
        )
    }
}
