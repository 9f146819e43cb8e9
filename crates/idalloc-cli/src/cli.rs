//! The command line: every command, flag and help text (clap derive). Parsing only; running is in
//! `commands`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::connect::EtcdArgs;
use crate::parse::{self, IdRange, StoreUrl};
use crate::remotes::RemoteArgs;

/// The help heading of the flags every command takes (`idalloc options` lists them), so that a
/// command's `--help` shows its own flags first.
pub const GLOBAL: &str = "Global options";

/// The most store requests of many keys (up to ~100 keys each) one process keeps in flight at
/// once (`--bulk-in-flight`, `--concurrency`): etcd applies requests one at a time, so more only
/// queue there, and 64 of them from 16 clients drove etcd to "too many requests", gigabytes of
/// memory and an apply backlog that failed calls for minutes after the load stopped.
pub const MAX_IN_FLIGHT: i64 = 32;

pub(crate) const TOP_HELP: &str = "\
Exit codes:
  0    success
  1    runtime error: spec mismatch, conflict, pool still has bindings, access refused (TLS, credentials, permissions)
  2    invalid input or usage
  3    not found (pool, key or ID)
  4    corrupt data in the store (run `idalloc check`)
  5    the store or server did not answer (unreachable, timed out, file busy): retrying may succeed
  6    pool exhausted
  141  stdout closed by its reader (e.g. `head`): stopped quietly
Errors go to stderr as one line starting with 'error: '.

-o json (or --json) gives one JSON document on stdout (JSON lines for `watch` and `acquire --from`),
and errors as {\"kind\",\"message\"} on stderr; -o yaml the same documents in YAML; -o name one pool
or key name per line; -o wide more columns. The shapes are listed in docs/guide/cli.md and in each
command's --help. `idalloc options` lists the flags every command takes.

Examples:
  idalloc pool create vni --range 4096-16777215
  idalloc acquire vni tenant-blue            # prints the ID
  idalloc --json get vni tenant-blue         # {\"pool\":\"vni\",\"key\":\"tenant-blue\",\"id\":...}
  idalloc --store etcd://127.0.0.1:2379 pool list
  idalloc --endpoints https://10.0.0.1:2379 --cacert ca.pem --cert me.pem --key me-key.pem \\
          --user idalloc pool list           # password: IDALLOC_PASSWORD, --password-file or prompt
  idalloc --etcd-config /var/lib/etcd-config/etcd.config status   # Cilium's etcd client config
  IDALLOC_STORE=memory: idalloc acquire p k --range 1-100
  IDALLOC_SERVER=http://127.0.0.1:7379 idalloc pool list   # through a running idalloc serve";

/// idalloc: small numeric IDs for string keys, the same in every process, on etcd or a local file.
#[derive(Parser, Debug)]
#[command(name = "idalloc", version, after_help = TOP_HELP)]
pub struct Cli {
    /// Where the data lives: file:PATH, memory: (throwaway), etcd://[USER@]HOST:PORT[,HOST:PORT...],
    /// http[s]://HOST:PORT[,...] [default: file:idalloc.redb, or etcd with --endpoints or
    /// --etcd-config].
    #[arg(long, global = true, help_heading = crate::cli::GLOBAL, env = idalloc::store::env::STORE, hide_env_values = true, value_parser = parse::store_url, value_name = "URL")]
    pub store: Option<StoreUrl>,

    #[command(flatten)]
    pub etcd: EtcdArgs,

    /// Run the command through `idalloc serve` at URL (several comma-separated: replicas, tried
    /// in turn) instead of opening a store; --cacert, --cert and --key then apply to it. For a
    /// file store that a running serve holds, and for hosts without store credentials.
    #[arg(
        long,
        global = true, help_heading = crate::cli::GLOBAL,
        env = idalloc_client::env::SERVER,
        value_delimiter = ',',
        value_name = "URL",
        conflicts_with = "store"
    )]
    pub server: Option<Vec<String>>,

    /// Bearer token for --server (a service with --auth-tokens): the first line of FILE.
    #[arg(long, global = true, help_heading = crate::cli::GLOBAL, env = idalloc_client::env::TOKEN_FILE, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,

    /// Root of every store key (several independent allocators can share one etcd).
    #[arg(
        long,
        global = true, help_heading = crate::cli::GLOBAL,
        env = idalloc::store::env::PREFIX,
        default_value = "idalloc",
        value_name = "P"
    )]
    pub prefix: String,

    /// Output format: text (the default), json (one document; JSON lines for watch and --from),
    /// yaml (one document; a `---` document per line for watch and --from), wide (text with more
    /// columns) or name (one pool or key name per line). Errors are `{"kind","message"}` on stderr
    /// under json.
    #[arg(short = 'o', long = "output", global = true, help_heading = crate::cli::GLOBAL, value_enum, value_name = "FORMAT")]
    pub output: Option<Format>,

    /// The same as -o json.
    #[arg(long, global = true, help_heading = crate::cli::GLOBAL)]
    pub json: bool,

    /// Tables (pool list, list) without their header line, for scripts.
    #[arg(long, global = true, help_heading = crate::cli::GLOBAL)]
    pub no_headers: bool,

    /// Bound on store requests: each command gives up with exit 5 after about this long when the
    /// store does not answer (3 attempts of a third each). Also sets the default wait for a busy
    /// file store (--lock-timeout): 6 times this.
    #[arg(long, global = true, help_heading = crate::cli::GLOBAL, default_value = "5s", value_parser = parse::duration, value_name = "DUR")]
    pub timeout: Duration,

    /// How long to wait for another idalloc process to release a file store [default: 6 x
    /// --timeout, so 30s].
    #[arg(long, global = true, help_heading = crate::cli::GLOBAL, env = "IDALLOC_LOCK_TIMEOUT", value_parser = parse::duration, value_name = "DUR")]
    pub lock_timeout: Option<Duration>,

    /// Log format on stderr: text or json. Filter with RUST_LOG (default: off; info for serve).
    #[arg(long, global = true, help_heading = crate::cli::GLOBAL, env = "IDALLOC_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The output format of `-o` and `--json`; both given, they must agree.
    pub fn format(&self) -> Result<Format, crate::fail::Failure> {
        match (self.output, self.json) {
            (None, false) => Ok(Format::Text),
            (None, true) | (Some(Format::Json), _) => Ok(Format::Json),
            (Some(f), false) => Ok(f),
            (Some(f), true) => Err(crate::fail::Failure::usage(format!(
                "--json is -o json, and -o says {}: give one of them",
                f.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default()
            ))),
        }
    }
}

/// What results are printed as (`-o`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Text for people: a line, a table, a block.
    Text,
    /// JSON: one document (JSON lines for streams).
    Json,
    /// YAML: one document (a `---` document per item for streams).
    Yaml,
    /// Text with more columns where the command has more to show.
    Wide,
    /// One pool or key name per line.
    Name,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create, list, show and delete pools.
    #[command(subcommand)]
    Pool(PoolCommand),

    /// Print the ID of KEY in POOL, binding a free ID if KEY has none, with a durable reference
    /// of HOLDER (idempotent per holder: acquiring twice needs one release).
    #[command(after_help = "\
JSON: {\"pool\":\"vni\",\"key\":\"tenant-blue\",\"id\":4242,\"new\":true,\"holder\":\"alice\"}
With --from: one such line per key, in input order; plain output is ID<TAB>KEY per line.
--from reads one key per line ('\\n' or '\\r\\n' ends a line; nothing else is trimmed). An empty
line or a line that is not a valid key is an error (exit 2, naming the line), found before any
ID is acquired. A key that fails later (a bad record, the store gone) stops the command after the
requests in flight: every key acquired is printed, then the error counts them.

Examples:
  idalloc acquire vni tenant-blue
  idalloc acquire vni tenant-blue --range 4096-16777215   # create the pool first if missing
  idalloc acquire vni --from keys.txt > ids.tsv
  printf 'a\\nb\\n' | idalloc --json acquire vni --from -")]
    Acquire(AcquireArgs),

    /// Drop HOLDER's reference to KEY; the binding is reclaimed when it was the last one. Exit 0
    /// also when nothing was held.
    #[command(after_help = "\
JSON: {\"pool\":\"vni\",\"key\":\"tenant-blue\",\"holder\":\"alice\",\"released\":true,\"reclaimed\":true}
With --from: one such output per key, in input order, each naming its key (keys read as for
acquire --from; a bad line is an error, exit 2, found before anything is released). A key that
fails stops it as it stops acquire --from: every key released is printed, then the error.

Examples:
  idalloc release vni tenant-blue
  idalloc release vni --from keys.txt")]
    Release(ReleaseArgs),

    /// Print the ID bound to KEY (exit 3 if none).
    #[command(after_help = "\
JSON: {\"pool\":\"vni\",\"key\":\"tenant-blue\",\"id\":4242}

With --remote NAME=URL (repeatable): one CLUSTER<TAB>ID line per cluster where KEY has an ID
(local first); JSON adds \"clusters\":[{\"cluster\":\"local\",\"id\":4242},...]. See docs/guide/multi-cluster.md.

Example:
  idalloc get vni tenant-blue
  idalloc get vni tenant-blue --remote b=etcd://10.0.1.5:2379")]
    Get(GetArgs),

    /// Print the key bound to ID (exit 3 if none).
    #[command(after_help = "\
JSON: {\"pool\":\"vni\",\"id\":4242,\"key\":\"tenant-blue\"}

With --remote NAME=URL (repeatable): CLUSTER<TAB>KEY, from the one cluster whose ID space
(prefix bits) holds ID; JSON adds \"cluster\".

Example:
  idalloc lookup vni 4242
  idalloc lookup vni 135170 --remote b=etcd://10.0.1.5:2379")]
    Lookup(LookupArgs),

    /// List POOL's bindings with their holders, sorted by ID.
    #[command(after_help = "\
JSON: {\"pool\":\"vni\",\"bindings\":[{\"id\":4242,\"key\":\"tenant-blue\",\"holders\":[\"alice\"]}]}

Example:
  idalloc list vni
  idalloc list vni --remote b=etcd://10.0.1.5:2379   # adds a CLUSTER column; remote rows
                                                      # have no holders (views hold bindings only)")]
    List(ListArgs),

    /// Print POOL's binding changes as they happen, until interrupted (ctrl-c exits 0).
    #[command(after_help = "\
Prints 'synced' (with the number of bindings) once the pool is read, then one line per change:
'bound ID KEY' or 'unbound ID KEY' (plus 'conflict ...' and 'lagged ...' notices).
On a file store, the file is polled (every --interval) so other processes can keep using it;
changes that come and go between two polls are not seen.

JSON lines: {\"event\":\"synced\",\"pool\":\"vni\",\"bindings\":3}
            {\"event\":\"upsert\",\"pool\":\"vni\",\"id\":4242,\"key\":\"tenant-blue\"}
            {\"event\":\"delete\",\"pool\":\"vni\",\"id\":4242,\"key\":\"tenant-blue\"}
            {\"event\":\"conflict\",\"pool\":\"vni\",\"key\":\"k\",\"old_id\":1,\"new_id\":2}
            {\"event\":\"lagged\",\"pool\":\"vni\",\"missed\":10}

Examples:
  idalloc watch vni
  idalloc --json watch vni --count 1    # stop after the first change
  idalloc watch vni --remote b=etcd://10.0.1.5:2379
      # 'synced CLUSTER N bindings' per cluster, then 'CLUSTER bound ID KEY' lines; JSON lines
      # carry \"cluster\". Needs an etcd (or memory) local store.")]
    Watch(WatchArgs),

    /// Reclaim bindings that nobody references (all pools if none is named).
    #[command(after_help = "\
A pool with an idle grace keeps an unreferenced binding for that long; a one-shot gc cannot see
how long a binding has been idle, so such bindings are reported as idle, not reclaimed (run a
long-lived allocator with a sweep interval for them).

JSON: {\"dry_run\":false,\"pools\":[{\"pool\":\"vni\",\"reclaimed\":[{\"id\":7,\"key\":\"k\"}],
       \"idle\":0,\"bindings\":12}]}

--holder NODE: releases every durable reference NODE holds (in POOL, or in every pool), each through
the ordinary release, so a binding another holder still references stays bound. The pools are read
page by page. Runs through --server too. Try it with --dry-run first.
JSON: {\"holder\":\"node-7\",\"dry_run\":false,\"pools\":[{\"pool\":\"vni\",\"released\":
       [{\"id\":7,\"key\":\"k\",\"reclaimed\":true}]}]}

Examples:
  idalloc gc --dry-run
  idalloc gc vni
  idalloc gc --holder node-7 --dry-run
  idalloc gc --holder node-7 pod-ips")]
    Gc(GcArgs),

    /// Audit POOL (or every pool) at one revision: report every record that breaks the layout's
    /// invariants; with --repair, fix what is safe to fix while allocators keep running.
    #[command(after_help = "\
Reports: an ID named by two key records, a key bound by two ID records, key records without their
ID record and the reverse, references without a binding, IDs out of range or reserved,
unreadable records, spec records naming another pool, data without a spec, nested prefixes.
Exit 0 when nothing is found (after --repair: when nothing is left), 1 otherwise.

--repair: each fix is one txn that compares every record it read (and the pool's spec) with the
scan, so it changes nothing if an allocator touched them meanwhile; fixes never change the ID a
holder was given. What cannot be fixed safely is listed as left for a person. The pool is then
checked again.

JSON: {\"revision\":42,\"breaches\":1,\"pools\":[{\"pool\":\"vni\",\"findings\":[{\"kind\":
       \"id_without_key_record\",\"id\":7,\"key\":\"k\",\"key_record\":null,\"message\":\"...\"}]}],
       \"other\":[]}
With --repair: {\"repairs\":[{\"pool\":\"vni\",\"finding\":{...},\"action\":\"...\",\"applied\":true}],
       \"after\":{...the report of the check after the repairs...}}

Examples:
  idalloc check
  idalloc --json check vni
  idalloc check vni --repair")]
    Check(CheckArgs),

    /// Show the store kind, endpoint, whether it answers, its revision and the pools.
    #[command(after_help = "\
Exit 1 if the store does not answer (the status is still printed).

JSON: {\"store\":\"etcd\",\"endpoint\":\"http://127.0.0.1:2379\",\"prefix\":\"idalloc\",
       \"reachable\":true,\"revision\":42,\"pools\":[\"vni\"],\"error\":null}

Example:
  idalloc --store etcd://127.0.0.1:2379 status")]
    Status,

    /// Run the HTTP/JSON service (API under /v1, /metrics, /healthz, /readyz) until SIGTERM/SIGINT.
    #[command(after_help = "\
Listens on 127.0.0.1:7379 unless --listen says otherwise (never on all interfaces unless asked).
Sweeps every pool of the store in the background. On SIGTERM/SIGINT it refuses new requests with
503, lets in-flight ones finish (up to --drain-timeout) and exits 0; client sessions are not ended,
their leases run out on their own TTL unless a client renews them elsewhere. API: docs/guide/api.md.

Security (docs/guide/security.md): --tls-cert/--tls-key serve HTTPS; --client-ca requires client
certificates; --auth-tokens requires a bearer token of a named client whose scope (read, allocate,
admin) covers the endpoint, and namespaces its durable holders by its name. A non-loopback --listen
is refused without TLS and one of --client-ca/--auth-tokens, unless --insecure-listen.

Examples:
  idalloc --store etcd://127.0.0.1:2379 serve
  idalloc --etcd-config /etc/idalloc/etcd.config serve --listen 10.0.0.5:7379 \\
          --tls-cert /etc/idalloc/tls.crt --tls-key /etc/idalloc/tls.key --auth-tokens /etc/idalloc/tokens
  idalloc --store file:/var/lib/idalloc/ids.redb serve --listen 127.0.0.1:8080
  RUST_LOG=idalloc=debug idalloc --log-format json serve")]
    Serve(ServeArgs),

    /// Show the cluster version (which protocol features are in force) or finalize an upgrade.
    #[command(subcommand)]
    Upgrade(UpgradeCommand),

    /// Print this client's version, git commit, API and record layout versions; with a store
    /// named (--store, IDALLOC_STORE, --endpoints or --etcd-config), its server's version too.
    #[command(after_help = "\
Exit 1 if a named store does not answer (the client's versions are still printed).

JSON: {\"version\":\"0.1.0\",\"git_sha\":\"0123456789ab\",\"api\":\"v1\",\"layout\":1,
       \"store\":\"etcd 3.4.27\"}   (store: only with a store named; null if it did not answer)

Examples:
  idalloc version
  idalloc --store etcd://127.0.0.1:2379 version")]
    Version,

    /// Print a completion script for SHELL (bash, zsh or fish) on stdout. Needs no store.
    #[command(after_help = "\
Generated from the same definitions as the parser, so it knows every command and flag of this
build. Installed by nothing. Examples, installing for one user (docs/guide/cli.md has more):
  idalloc completions bash > ~/.local/share/bash-completion/completions/idalloc
  idalloc completions zsh  > ~/.zfunc/_idalloc      # with fpath+=(~/.zfunc) before compinit
  idalloc completions fish > ~/.config/fish/completions/idalloc.fish")]
    Completions(CompletionsArgs),

    /// List the flags every command takes (global options), with their environment variables.
    Options,

    /// Complete a value for the shell completion scripts: the pools' names, one per line.
    #[command(name = "__complete", hide = true)]
    Complete(CompleteArgs),

    /// Print the man page (roff) on stdout, or with --dir write one page per command there.
    /// Needs no store.
    #[command(after_help = "\
Generated from the same definitions as --help. Installed by nothing. Examples (docs/guide/cli.md):
  idalloc man --dir /usr/local/share/man/man1      # idalloc.1, idalloc-acquire.1, ...
  idalloc man | man -l -                           # read it without installing")]
    Man(ManArgs),
}

/// The shells `idalloc completions` writes scripts for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ShellArg {
    Bash,
    Zsh,
    Fish,
}

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: ShellArg,
}

/// What `__complete` lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CompleteWhat {
    Pools,
}

#[derive(Args, Debug)]
pub struct CompleteArgs {
    /// What to list.
    #[arg(value_enum)]
    pub what: CompleteWhat,
}

#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write idalloc.1 and one page per subcommand (idalloc-pool-create.1, ...) into this
    /// existing directory instead of printing the main page.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Read these flags from a TOML file: the long flags' names as keys (`sweep-interval = "30s"`,
    /// `max-body = 1048576`, `insecure-listen = true`). Flags and environment variables override
    /// the file; an unknown key is an error.
    #[arg(long, env = "IDALLOC_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, env = "IDALLOC_LISTEN", default_value = "127.0.0.1:7379", value_name = "ADDR")]
    pub listen: std::net::SocketAddr,
    /// How often each pool is swept (bindings nobody references are reclaimed).
    #[arg(long, env = "IDALLOC_SWEEP_INTERVAL", value_parser = parse::duration, value_name = "DUR", default_value = "30s")]
    pub sweep_interval: Duration,
    /// Largest request body accepted (bytes); larger ones get 413.
    #[arg(long, env = "IDALLOC_MAX_BODY", value_name = "BYTES", default_value = "1048576")]
    pub max_body: usize,
    /// Changes of each watched pool kept in memory for watch streams to read and resume from
    /// (`Last-Event-ID`); a stream further behind is ended with a `lagged` event.
    #[arg(long, env = "IDALLOC_WATCH_HISTORY", value_name = "CHANGES", default_value = "10000", value_parser = clap::value_parser!(u32).range(1..))]
    pub watch_history: u32,
    /// Watch-stream wake-ups per second each watched pool aims at, at most: the streams of a
    /// pool are woken together once per window, and the window (10 ms at least, 250 ms at most)
    /// widens with their number to stay within this. Lower: less CPU per watcher of a busy pool,
    /// later delivery.
    #[arg(long, env = "IDALLOC_WATCH_WAKE_BUDGET", value_name = "PER_SEC", default_value_t = idalloc_server::fanout::WAKE_BUDGET, value_parser = clap::value_parser!(u64).range(1..))]
    pub watch_wake_budget: u64,
    /// Store txns of many-key requests and of pages (up to ~100 keys a txn) in flight at once,
    /// at most (1 to 32: more only queue at etcd, and 64 of them from 16 clients drove it to "too
    /// many requests"); the rest wait in the service, in turns between clients: one txn per
    /// client while several have such work, one of at most 25 keys in all while single-key
    /// requests go on, a client resting as long as its txn took before its next while another's
    /// go on. Single-key requests never wait for them.
    #[arg(long, env = "IDALLOC_BULK_IN_FLIGHT", value_name = "TXNS", default_value_t = idalloc::allocator::DEFAULT_BULK_IN_FLIGHT as u32, value_parser = clap::value_parser!(u32).range(1..=MAX_IN_FLIGHT))]
    pub bulk_in_flight: u32,
    /// After SIGTERM, how long in-flight requests may take before the process exits anyway.
    #[arg(long, env = "IDALLOC_DRAIN_TIMEOUT", value_parser = parse::duration, value_name = "DUR", default_value = "10s")]
    pub drain_timeout: Duration,
    /// After SIGTERM, how long /readyz answers 503 while every request is still served, before
    /// the drain begins: the time a load balancer (a Kubernetes Service's endpoints) takes to
    /// stop sending new connections here. 0: drain at once.
    #[arg(long, env = "IDALLOC_SHUTDOWN_DELAY", value_parser = parse::duration, value_name = "DUR", default_value = "0s")]
    pub shutdown_delay: Duration,
    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key. Reloaded on SIGHUP and
    /// when the file changes.
    #[arg(long, env = "IDALLOC_TLS_CERT", value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "IDALLOC_TLS_KEY", value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM): mutual TLS. Needs --tls-cert.
    #[arg(long, env = "IDALLOC_CLIENT_CA", value_name = "FILE", requires = "tls_cert")]
    pub client_ca: Option<PathBuf>,
    /// Bearer tokens of named clients with scopes (read, allocate, admin), one
    /// `NAME SCOPE sha256:HEX|file:PATH` per line; every endpoint but /healthz and /readyz then
    /// needs a token. See docs/guide/security.md.
    #[arg(long, env = "IDALLOC_AUTH_TOKENS", value_name = "FILE")]
    pub auth_tokens: Option<PathBuf>,
    /// Allow --listen on a non-loopback address without TLS and client authentication (tokens or
    /// client certificates): anyone who reaches the port can then allocate, release and delete
    /// pools. For a trusted network or a TLS-terminating proxy only.
    #[arg(long, env = "IDALLOC_INSECURE_LISTEN")]
    pub insecure_listen: bool,
    /// Most connections open at once; at the cap a new connection closes one of the client
    /// holding the most (its idle one, else its newest), or gets 503 `overloaded` if that client
    /// is its own and has none idle. Default: the open-files limit minus 128, at most 10000 (so
    /// connections never run the process out of descriptors).
    #[arg(long, env = "IDALLOC_MAX_CONNECTIONS", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: Option<u32>,
    /// A new connection must say its protocol (its first bytes) and an HTTP/1 client send each
    /// request's header within this (also the first request).
    #[arg(long, env = "IDALLOC_HEADER_TIMEOUT", value_parser = parse::duration, value_name = "DUR",
          default_value = "10s")]
    pub header_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    #[arg(long, env = "IDALLOC_IDLE_TIMEOUT", value_parser = parse::duration, value_name = "DUR",
          default_value = "60s")]
    pub idle_timeout: Duration,
    /// Probes for clients whose host vanished without closing: TCP keepalive on every accepted
    /// connection after this long without traffic (then every third of it; dropped after 3
    /// unanswered probes, and when sent data stays unacknowledged that long in all), and HTTP/2
    /// PINGs at this interval. 0 turns both off.
    #[arg(long, env = "IDALLOC_KEEPALIVE", value_parser = parse::duration, value_name = "DUR",
          default_value = "30s")]
    pub keepalive: Duration,
    /// The longest a request body may take to arrive, whole (a deadline from the request's
    /// head, however slowly the body trickles).
    #[arg(long, env = "IDALLOC_BODY_TIMEOUT", value_parser = parse::duration, value_name = "DUR",
          default_value = "30s")]
    pub body_timeout: Duration,
    /// Requests in flight at once in total; more get 503 `overloaded`.
    #[arg(long, env = "IDALLOC_MAX_REQUESTS", value_name = "N", default_value = "1024",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_requests: u32,
    /// Requests in flight at once per client (token name, or IP address without tokens), HTTP/2
    /// streams included; more get 429 `rate_limited` with Retry-After.
    #[arg(long, env = "IDALLOC_MAX_REQUESTS_PER_CLIENT", value_name = "N", default_value = "128",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_requests_per_client: u32,
    /// Connections one client (token name, or IP address without tokens) may hold; a request on
    /// a connection over it gets 429 `rate_limited` and the connection is closed. /healthz,
    /// /readyz and /metrics are never refused for it. Default: a quarter of --max-connections, at
    /// least 16 (all of them below 16).
    #[arg(long, env = "IDALLOC_MAX_CONNECTIONS_PER_CLIENT", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections_per_client: Option<u32>,
    /// Watch streams one client may hold open at once (HTTP/1 and HTTP/2); more get 429
    /// `rate_limited`.
    #[arg(long, env = "IDALLOC_MAX_WATCHES_PER_CLIENT", value_name = "N", default_value = "1000",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_watches_per_client: u32,
}

#[derive(Subcommand, Debug)]
pub enum UpgradeCommand {
    /// Print the store's cluster version, the features it puts in force, this build's protocol
    /// and whether a finalize is pending.
    #[command(after_help = "\
JSON: {\"prefix\":\"idalloc\",\"cluster_version\":1,\"recorded\":false,\"features\":[\"holder-fences\"],
       \"grace_seconds\":null,\"protocol\":2,\"runs_on\":[1,2],\"finalize_pending\":true,\"client_sessions\":0}
Exit 1 if this build does not run on the store's cluster version.

Processes do not record their build in the store: before finalize, make sure (from your
deployment) that every process runs this version. docs/guide/deployment.md, \"Upgrades\".

Example:
  idalloc --store etcd://127.0.0.1:2379 upgrade status")]
    Status,

    /// Move the cluster version to this build's protocol: once the grace has passed, the features
    /// older builds would break go into force. Only once every process of an older build has
    /// stopped. Cannot be undone.
    #[command(after_help = "\
JSON: {\"prefix\":\"idalloc\",\"from\":1,\"to\":2,\"finalized\":true,\"grace_seconds\":1200}
      (finalized: false if it was already; grace_seconds: 0 then)

The grace covers requests an older process sent before it stopped and the network still
delivers: fence folding and narrowing resizes wait for it (the store ends it, on a lease).

Example:
  idalloc --store etcd://127.0.0.1:2379 upgrade finalize")]
    Finalize {
        /// How long the new features wait after the finalize: longer than any request of an older
        /// process can take to reach the store. 0s puts them in force at once.
        #[arg(long, value_parser = parse::duration, value_name = "DUR", default_value = "20m")]
        grace: Duration,
    },
}

#[derive(Subcommand, Debug)]
pub enum PoolCommand {
    /// Create pool NAME; succeeds if an equal pool exists, fails (exit 1, showing both specs) if a
    /// different one does.
    #[command(after_help = "\
JSON: {\"pool\":\"vni\",\"spec\":{\"name\":\"vni\",\"min\":4096,\"max\":16777215,\"reserved\":[[5000,5010]],
       \"prefix\":0,\"strategy\":\"random\",\"idle_grace_ms\":0,\"reuse_delay_ms\":0}}

Examples:
  idalloc pool create vni --range 4096-16777215
  idalloc pool create ids --range 1-65535 --reserve 5,7,10-20 --strategy lowest --reuse-delay 5m")]
    Create(CreateArgs),

    /// Table of pools: name, range, bound, free, % used.
    #[command(after_help = "\
'bound' counts bindings; 'free' is the capacity (range minus reserved IDs) minus bound IDs and IDs
waiting out their reuse delay.

JSON: {\"pools\":[{\"pool\":\"vni\",\"spec\":{...},\"capacity\":100,\"bound\":3,\"quarantined\":0,
       \"free\":97,\"used_percent\":3.0}]}

Example:
  idalloc pool list")]
    List,

    /// Show one pool's spec and usage.
    #[command(after_help = "\
JSON: one element of `pool list`'s \"pools\".

Example:
  idalloc pool show vni")]
    Show(PoolArg),

    /// Give pool NAME a new range (and reserved IDs). Growing always succeeds; narrowing is refused
    /// (exit 1) while an ID outside the new range, or newly reserved, is bound or quarantined.
    #[command(after_help = "\
Without --reserve, the pool's reserved IDs inside the new range stay reserved. The name, prefix,
strategy and reclaim settings never change. Every process with the pool open learns the new range.
Prefix pools resize their raw range; the new MAX must leave the prefix bits free.

JSON: the same as `pool create`'s.

Examples:
  idalloc pool resize vni --range 4096-33554431
  idalloc pool resize ids --range 1-65535 --reserve 5,7")]
    Resize(ResizeArgs),

    /// Delete pool NAME. Refuses (exit 1) while it has bindings unless --force, which deletes them
    /// too.
    #[command(after_help = "\
JSON: {\"pool\":\"vni\",\"deleted\":true}

Example:
  idalloc pool delete vni --force")]
    Delete(DeleteArgs),
}

#[derive(Args, Debug)]
pub struct PoolArg {
    /// Pool name: [a-z0-9][a-z0-9._-]{0,62}.
    pub pool: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StrategyArg {
    Random,
    Lowest,
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// Pool name: [a-z0-9][a-z0-9._-]{0,62}.
    pub name: String,
    /// Inclusive raw ID range, MIN >= 1.
    #[arg(long, value_parser = parse::id_range, value_name = "MIN-MAX")]
    pub range: IdRange,
    /// Raw IDs never handed out, e.g. 5,7,10-20.
    #[arg(long, value_name = "LIST")]
    pub reserve: Option<String>,
    /// Bits ORed into every ID handed out (hexadecimal); must not overlap MAX's bits.
    #[arg(long, value_parser = parse::hex_bits, value_name = "HEX")]
    pub prefix_bits: Option<u64>,
    /// How a free ID is chosen.
    #[arg(long, value_enum, default_value = "random")]
    pub strategy: StrategyArg,
    /// How long an unreferenced binding is kept (same key back in time gets the same ID).
    #[arg(long, value_parser = parse::duration, value_name = "DUR", default_value = "0")]
    pub idle_grace: Duration,
    /// How long a reclaimed ID stays unusable before another key may get it.
    #[arg(long, value_parser = parse::duration, value_name = "DUR", default_value = "0")]
    pub reuse_delay: Duration,
}

#[derive(Args, Debug)]
pub struct ResizeArgs {
    /// Pool name.
    pub name: String,
    /// The new inclusive raw ID range, MIN >= 1.
    #[arg(long, value_parser = parse::id_range, value_name = "MIN-MAX")]
    pub range: IdRange,
    /// Raw IDs never handed out, e.g. 5,7,10-20 (replaces the pool's list; '' for none).
    #[arg(long, value_name = "LIST")]
    pub reserve: Option<String>,
}

#[derive(Args, Debug)]
pub struct DeleteArgs {
    /// Pool name.
    pub name: String,
    /// Delete the pool even if it has bindings, and them with it.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct AcquireArgs {
    /// Pool name.
    pub pool: String,
    /// The key (any non-empty UTF-8 up to 4096 bytes). Omit with --from.
    #[arg(required_unless_present = "from", conflicts_with = "from")]
    pub key: Option<String>,
    /// Read keys from FILE, one per line ('-' for stdin).
    #[arg(long, value_name = "FILE|-")]
    pub from: Option<PathBuf>,
    /// Owner of the reference [default: $USER, else $LOGNAME, else "idalloc"].
    #[arg(long, value_name = "H")]
    pub holder: Option<String>,
    /// Create the pool with this range first if it does not exist.
    #[arg(long, value_parser = parse::id_range, value_name = "MIN-MAX")]
    pub range: Option<IdRange>,
    /// Batches of keys (up to 100 keys, one store request each) in flight at once with --from,
    /// 1 to 32. etcd applies requests one at a time, so more only queue there: 8 was as fast as
    /// 64 in the benchmark (docs/benchmarks/findings.md, the 8× target), and 64 × 100 queued
    /// keys came near the request timeout on a loaded etcd.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=MAX_IN_FLIGHT))]
    pub concurrency: u16,
}

#[derive(Args, Debug)]
pub struct ReleaseArgs {
    /// Pool name.
    pub pool: String,
    /// The key. Omit with --from.
    #[arg(required_unless_present = "from", conflicts_with = "from")]
    pub key: Option<String>,
    /// Read keys from FILE, one per line ('-' for stdin).
    #[arg(long, value_name = "FILE|-")]
    pub from: Option<PathBuf>,
    /// Owner of the reference [default: $USER, else $LOGNAME, else "idalloc"].
    #[arg(long, value_name = "H")]
    pub holder: Option<String>,
    /// Batches of keys in flight at once with --from, 1 to 32. A release txn is heavier than an
    /// acquire's (range compares on the references), and 64 batches of 100 releases queued on a
    /// loaded etcd outlasted the request timeout in a 100,000-key run.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=MAX_IN_FLIGHT))]
    pub concurrency: u16,
}

#[derive(Args, Debug)]
pub struct GetArgs {
    /// Pool name.
    pub pool: String,
    /// The key.
    pub key: String,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

#[derive(Args, Debug)]
pub struct LookupArgs {
    /// Pool name.
    pub pool: String,
    /// The ID (as handed out, prefix bits included).
    pub id: u64,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

#[derive(Args, Debug)]
pub struct WatchArgs {
    /// Pool name.
    pub pool: String,
    /// Stop after N changes (upsert, delete, conflict).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// How often a file store is polled.
    #[arg(long, value_parser = parse::duration, value_name = "DUR", default_value = "500ms")]
    pub interval: Duration,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Pool name: [a-z0-9][a-z0-9._-]{0,62}.
    pub pool: String,
    /// Only the bindings this holder references.
    #[arg(long, value_name = "H", conflicts_with = "remotes")]
    pub holder: Option<String>,
    /// Only the keys that start with P.
    #[arg(long, value_name = "P", conflicts_with = "remotes")]
    pub key_prefix: Option<String>,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Only this pool.
    pub pool: Option<String>,
    /// Fix what is safe to fix (see below), then check again.
    #[arg(long)]
    pub repair: bool,
}

#[derive(Args, Debug)]
pub struct GcArgs {
    /// Only this pool.
    pub pool: Option<String>,
    /// Report what would be reclaimed (or released, with --holder) without changing anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Release every durable reference of holder NODE instead (a node that is gone); a binding
    /// is reclaimed when that was its last reference.
    #[arg(long, value_name = "NODE")]
    pub holder: Option<String>,
}
