//! The output of each kind of result, one function per kind, used alike by the commands on a
//! store (`commands`) and through `idalloc serve` (`through`), so both print the same in every
//! format (`-o text|json|yaml|wide|name`).

use idalloc::{Acquired, PoolSpec, Released};
use serde_json::json;

use crate::commands::Out;
use crate::fail::Failure;
use crate::render::{self, Usage};

/// `pool create`.
pub fn pool_ready(spec: &PoolSpec, out: Out) -> Result<(), Failure> {
    out.either(
        || json!({"pool": spec.name(), "spec": render::spec_json(spec)}),
        || format!("pool {} ready: {}\n", spec.name(), spec),
    )
}

/// `pool list`: the pools' usage, and the spec records that cannot be used.
pub fn pools(
    usages: &[Usage],
    broken: &[idalloc::records::SpecProblem],
    out: Out,
) -> Result<(), Failure> {
    out.either(
        || {
            json!({"pools": usages.iter().map(Usage::to_json).collect::<Vec<_>>(),
                   "broken": render::broken_json(broken)})
        },
        || {
            if out.is_wide() {
                render::pools_table_wide(usages, !out.no_headers)
            } else {
                render::pools_table(usages, !out.no_headers)
            }
        },
    )
}

/// `pool show`.
pub fn pool(u: &Usage, out: Out) -> Result<(), Failure> {
    out.either(|| u.to_json(), || render::pool_show(u))
}

/// `pool resize`: the spec now in force.
pub fn pool_resized(spec: &PoolSpec, out: Out) -> Result<(), Failure> {
    out.either(
        || json!({"pool": spec.name(), "spec": render::spec_json(spec)}),
        || format!("pool {} resized: {}\n", spec.name(), spec),
    )
}

/// `pool delete` of a pool that was there.
pub fn pool_deleted(name: &str, out: Out) -> Result<(), Failure> {
    out.either(|| json!({"pool": name, "deleted": true}), || format!("pool {name} deleted\n"))
}

/// `acquire POOL KEY`: the ID (wide: a table of the ID, key, whether it is new, the holder).
pub fn acquired(
    pool: &str,
    key: &str,
    got: &Acquired,
    holder: &str,
    out: Out,
) -> Result<(), Failure> {
    out.either(
        || json!({"pool": pool, "key": key, "id": got.id, "new": got.new, "holder": holder}),
        || {
            if out.is_wide() {
                let row = vec![
                    got.id.to_string(),
                    render::text(key).into_owned(),
                    if got.new { "yes" } else { "no" }.to_string(),
                    render::text(holder).into_owned(),
                ];
                render::table_block(&["ID", "KEY", "NEW", "HOLDER"], &[row], !out.no_headers)
            } else {
                format!("{}\n", got.id)
            }
        },
    )
}

/// The output of one `release`.
pub fn released(pool: &str, key: &str, holder: &str, r: Released, out: Out) -> Result<(), Failure> {
    out.either(
        || {
            json!({"pool": pool, "key": key, "holder": holder,
                   "released": r.held, "reclaimed": r.reclaimed})
        },
        // The key quoted with `{:?}`: it escapes every character `render::text` does (controls,
        // bidi controls), and the quotes show where a key with spaces begins and ends.
        || match (r.held, r.reclaimed) {
            (false, _) => {
                format!("{} held nothing for {:?} in {}\n", render::text(holder), key, pool)
            }
            (true, true) => format!("released; {:?} was reclaimed\n", key),
            (true, false) => "released\n".to_string(),
        },
    )
}

/// A pair of ID and key (wide: as a table with its header).
fn id_and_key(id: u64, key: &str, out: Out) -> String {
    let row = vec![id.to_string(), render::text(key).into_owned()];
    render::table_block(&["ID", "KEY"], &[row], !out.no_headers)
}

/// `get POOL KEY`: the ID of KEY, or exit 3.
pub fn id_of(pool: &str, key: &str, id: Option<u64>, out: Out) -> Result<u8, Failure> {
    let Some(id) = id else {
        return Err(Failure::not_found(format!(
            "key {} has no ID in pool {pool:?}",
            idalloc::error::show_value(key)
        )));
    };
    out.either(
        || json!({"pool": pool, "key": key, "id": id}),
        || if out.is_wide() { id_and_key(id, key, out) } else { format!("{id}\n") },
    )?;
    Ok(0)
}

/// `lookup POOL ID`: the key bound to ID, or exit 3.
pub fn key_of(pool: &str, id: u64, key: Option<String>, out: Out) -> Result<u8, Failure> {
    let Some(key) = key else {
        return Err(Failure::not_found(format!("ID {id} is not bound in pool {pool:?}")));
    };
    out.either(
        || json!({"pool": pool, "id": id, "key": key}),
        || {
            if out.is_wide() {
                id_and_key(id, &key, out)
            } else {
                format!("{}\n", render::text(&key))
            }
        },
    )?;
    Ok(0)
}

/// `__complete pools`: the names, one a line, for the shell's completion script.
pub fn completions<'a>(names: impl Iterator<Item = &'a str>) -> Result<u8, Failure> {
    let text: String = names.map(|n| format!("{n}\n")).collect();
    Out::plain().text(&text).map(|_| 0)
}
