//! `idalloc-ipam`: a CNI IPAM plugin on idalloc pools (DESIGN §14, "An address is an ID").
//!
//! A subnet is a pool whose range is its usable hosts (address = subnet base + ID); the gateway
//! and `exclude` entries are reserved IDs; an attachment (network name, container ID, interface)
//! is the key and the node is the holder of a durable reference. So two concurrent ADDs never
//! get one address (the library's one-txn bind), ADD repeated for one attachment returns the same
//! address, DEL and GC free exactly what they name, and a node that is gone frees its addresses
//! with one `idalloc-ipam release-node NODE`. User guide: `docs/guide/ipam.md`.
//!
//! Layout: `cni` (the protocol: verbs, environment, versions, errors), `config` (the network
//! configuration), `addr` (addresses as IDs) are pure; `backend` (a store or `idalloc serve`)
//! and `plugin` (the verbs) do the I/O; `main.rs` reads the environment and stdin and prints.

#![forbid(unsafe_code)]

pub mod addr;
pub mod backend;
pub mod cni;
pub mod config;
pub mod plugin;
