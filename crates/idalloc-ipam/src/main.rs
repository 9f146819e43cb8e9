//! The `idalloc-ipam` binary. With `CNI_COMMAND` set it is a CNI plugin: the network
//! configuration on stdin, the result (or the spec's error object, exit status 1) on stdout.
//! Otherwise it runs an administration command (`release-node`), see `--help`.

use std::io::{Read, Write};
use std::process::ExitCode;

use idalloc_ipam::cni::{self, code, CniError};
use idalloc_ipam::{config, plugin};

const HELP: &str = "\
idalloc-ipam: a CNI IPAM plugin on idalloc pools (docs/guide/ipam.md).

As a CNI plugin: run by the container runtime with CNI_COMMAND (ADD, DEL, CHECK, GC, STATUS,
VERSION) and the network configuration on stdin.

Administration:
  idalloc-ipam release-node NODE --config FILE
      Release every address NODE holds in the pools of the network configuration FILE (a .conf
      or a .conflist as in /etc/cni/net.d): for a node that is gone. Prints {\"released\":N}.
  idalloc-ipam import-whereabouts IPPOOLS.json --config FILE [--ifname IF] [--network-name N]
      Bind every allocation of the Whereabouts IPPools in IPPOOLS.json (`kubectl get
      ippools.whereabouts.cni.cncf.io -A -o json`) whose range lies in a subnet of FILE (the
      network's pool and its node slices' pools) to the same address, held by
      \"whereabouts-import\" until the pod's DEL. Entries without an ifname take IF (default
      net1). With --network-name, only the pools Whereabouts named for that network_name
      (N-RANGE, N-NODE-RANGE). FILE must use ipam.store. Prints {\"imported\":N}.
";

fn main() -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("idalloc-ipam: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    if std::env::var_os("CNI_COMMAND").is_none() && !args.is_empty() {
        return rt.block_on(admin(&args));
    }
    rt.block_on(cni_main())
}

fn print(v: &serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

async fn cni_main() -> ExitCode {
    let mut stdin = Vec::new();
    let read = std::io::stdin().read_to_end(&mut stdin);
    // The error object carries the input's version when the plugin implements it.
    let version = config::version_of(&stdin)
        .filter(|v| cni::SUPPORTED.contains(&v.as_str()))
        .unwrap_or_else(|| cni::LATEST.to_string());
    let result = match cni::invocation(&|n| std::env::var(n).ok()) {
        Err(e) => Err(e),
        Ok(_) if read.is_err() => Err(CniError::new(
            code::IO_FAILURE,
            "cannot read the network configuration from stdin",
            read.err().map(|e| e.to_string()).unwrap_or_default(),
        )),
        Ok(inv) => plugin::run(&inv, &stdin).await,
    };
    match result {
        Ok(Some(v)) => {
            print(&v);
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::SUCCESS,
        Err(e) => {
            print(&e.to_json(&version));
            ExitCode::FAILURE
        }
    }
}

/// The network configuration in `text`: a `.conf`, or the plugin of a `.conflist` whose `ipam`
/// is this plugin's, with the list's `cniVersion` and `name`.
fn netconf_of(text: &str) -> Result<Vec<u8>, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let Some(plugins) = v.get("plugins").and_then(|p| p.as_array()) else {
        return Ok(text.as_bytes().to_vec());
    };
    let p = plugins
        .iter()
        .find(|p| {
            p.get("ipam").and_then(|i| i.get("type")).and_then(|t| t.as_str())
                == Some("idalloc-ipam")
        })
        .ok_or("no plugin of the list has \"ipam\": {\"type\": \"idalloc-ipam\"}")?;
    let conf =
        serde_json::json!({"cniVersion": v["cniVersion"], "name": v["name"], "ipam": p["ipam"]});
    Ok(conf.to_string().into_bytes())
}

async fn admin(args: &[String]) -> ExitCode {
    let fail = |m: String| {
        eprintln!("idalloc-ipam: {m}");
        ExitCode::from(2)
    };
    if args.first().map(String::as_str) == Some("import-whereabouts") {
        return import(&args[1..]).await;
    }
    let (node, file) = match args {
        [cmd, node, flag, file] if cmd == "release-node" && flag == "--config" => (node, file),
        [cmd, flag, file, node] if cmd == "release-node" && flag == "--config" => (node, file),
        [h] if h == "--help" || h == "-h" => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        _ => return fail(format!("unknown arguments {args:?}\n\n{HELP}")),
    };
    let conf = match read_conf(file) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    match plugin::release_node(&conf, node).await {
        Ok(n) => {
            print(&serde_json::json!({"released": n, "node": node}));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("idalloc-ipam: {}: {}", e.msg, e.details);
            ExitCode::FAILURE
        }
    }
}

fn read_conf(file: &str) -> Result<config::NetConf, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("--config {file:?}: cannot read: {e}"))?;
    netconf_of(&text)
        .map_err(|e| CniError::new(code::DECODING, format!("--config {file:?}"), e))
        .and_then(|b| config::parse_json(&b))
        .and_then(|m| config::parse(&m))
        .map_err(|e| format!("{}: {}", e.msg, e.details))
}

async fn import(args: &[String]) -> ExitCode {
    let fail = |m: String| {
        eprintln!("idalloc-ipam import-whereabouts: {m}");
        ExitCode::from(2)
    };
    let (mut input, mut file, mut ifname, mut network) = (None, None, "net1".to_string(), None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--config" => file = it.next().cloned(),
            "--ifname" => match it.next() {
                Some(i) => ifname = i.clone(),
                None => return fail("--ifname needs a value".into()),
            },
            "--network-name" => match it.next() {
                Some(n) => network = Some(n.clone()),
                None => return fail("--network-name needs a value".into()),
            },
            other if input.is_none() && !other.starts_with("--") => input = Some(other.to_string()),
            other => return fail(format!("unknown argument {other:?}\n\n{HELP}")),
        }
    }
    let (Some(input), Some(file)) = (input, file) else {
        return fail(format!("needs IPPOOLS.json and --config FILE\n\n{HELP}"));
    };
    let conf = match read_conf(&file) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let doc: serde_json::Value = match std::fs::read(&input)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(d) => d,
        Err(e) => return fail(format!("{input:?}: {e}")),
    };
    let list = match plugin::whereabouts_allocations(&conf, &doc, &ifname, network.as_deref()) {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    match plugin::import(&conf, &list).await {
        Ok(n) => {
            print(&serde_json::json!({"imported": n}));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("idalloc-ipam import-whereabouts: {}: {}", e.msg, e.details);
            ExitCode::FAILURE
        }
    }
}
