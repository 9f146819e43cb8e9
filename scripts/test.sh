#!/usr/bin/env bash
# The project's test command (README): installs etcd, protoc, python3, prometheus and mdbook if missing, starts ONE etcd on a
# free loopback port for the whole run, then runs fmt, clippy and every test of the workspace.
# Extra arguments go to `cargo test`. Works non-interactively (CI=true, no terminal, as root).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# --- tools -------------------------------------------------------------------------------------
missing=()
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
# etcdctl (Debian ships it apart from the server): serve_ready.rs, the chaos tests and the soak run it.
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
# python3: the serve tests run the stdlib-only Python client (clients/python) against a real serve.
command -v python3 >/dev/null 2>&1 || missing+=(python3)
# go (1.19 or newer, standard library only: no module is downloaded): the Go client's tests
# (clients/go) run `go vet` and `go test` against a real serve. openssl: the Python client's tests
# make their TLS certificates with it. pip: the Python client is installed from its directory.
command -v go >/dev/null 2>&1 || missing+=(golang-go)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# curl and jq: the guide's examples run as written (crates/idalloc-cli/tests/docs_examples.rs),
# and the HTTP API's page calls serve with curl and reads a session id with jq.
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v jq >/dev/null 2>&1 || missing+=(jq)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
# prometheus and promtool: the serve tests scrape a real serve with a real Prometheus and unit-test
# the shipped alert rules (deploy/prometheus). The package may start a system Prometheus on 9090;
# the tests run their own on a free port.
{ command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; } || missing+=(prometheus)
# ip, nft and iptables: the network-namespace chaos test (crates/idalloc-chaos/tests/chaos_netns.rs)
# builds its own hosts in namespaces and injects partitions, loss, duplication and delay with them.
# It needs root; as another user it prints why it skips.
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v nft >/dev/null 2>&1 || missing+=(nftables)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
# The CNI bridge plugin and ping: the IPAM plugin's test with the real bridge plugin in network
# namespaces (crates/idalloc-ipam/tests/bridge.rs; root only, it prints why it skips otherwise).
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
command -v ping >/dev/null 2>&1 || missing+=(iputils-ping)
# zsh and fish: the completion scripts are run in them (crates/idalloc-cli/tests/cli_formats.rs).
command -v zsh >/dev/null 2>&1 || missing+=(zsh)
command -v fish >/dev/null 2>&1 || missing+=(fish)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "test.sh: installing ${missing[*]}" >&2
    sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo=(sudo)
        else
            echo "test.sh: need ${missing[*]} but am not root and there is no sudo" >&2
            exit 1
        fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update
    "${sudo[@]}" apt-get install -y "${missing[@]}"
fi
# Debian's etcd-server package may start a system etcd on 2379; ours uses its own free port.
# schemathesis (PyPI): the OpenAPI-driven fuzz test of serve (crates/idalloc-cli/tests/serve_openapi.rs)
# runs its `st` command; that test fails when it is missing (IDALLOC_SKIP_SCHEMATHESIS=1 skips it).
if ! python3 -c 'import schemathesis' >/dev/null 2>&1 || ! command -v st >/dev/null 2>&1; then
    echo "test.sh: installing schemathesis (pip)" >&2
    # A system Python that PEP 668 marks as externally managed (Debian's) refuses a plain install.
    python3 -m pip install --quiet schemathesis \
        || python3 -m pip install --quiet --break-system-packages schemathesis
fi
# mdbook (crates.io): the book in docs/ (book.toml) is built below with warnings as errors. Only the
# search feature: no `mdbook serve` or `watch` dependencies to compile.
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
if ! command -v mdbook >/dev/null 2>&1; then
    echo "test.sh: installing mdbook (cargo install)" >&2
    cargo install --locked --version 0.5.4 mdbook --no-default-features --features search
fi

# --- open files --------------------------------------------------------------------------------
# serve_watch.rs holds 1,000 watch streams and serve_limits.rs 2,000 sockets in one process (and
# serve sizes its connection cap from the limit it inherits). Many systems start processes with a
# soft limit of 1,024 under a far higher hard one: raise the soft limit (to 65,536 at most).
soft="$(ulimit -Sn)"
hard="$(ulimit -Hn)"
if [ "$soft" != unlimited ] && [ "$soft" -lt 65536 ]; then
    want=65536
    if [ "$hard" != unlimited ] && [ "$hard" -lt "$want" ]; then
        want="$hard"
    fi
    ulimit -Sn "$want" || echo "test.sh: cannot raise the open-files limit from $soft to $want" >&2
fi
if [ "$(ulimit -Sn)" != unlimited ] && [ "$(ulimit -Sn)" -lt 4096 ]; then
    echo "test.sh: the open-files limit is $(ulimit -Sn) (hard $hard): the tests with 1,000 and" \
        "2,000 sockets will fail; raise the hard limit (e.g. LimitNOFILE, or ulimit -Hn as root)" >&2
fi

# --- one etcd for the run ------------------------------------------------------------------------
etcd_dir="$(mktemp -d -t idalloc-test-etcd.XXXXXX)"
etcd_pid=""
cleanup() {
    if [ -n "$etcd_pid" ]; then
        kill "$etcd_pid" 2>/dev/null || true
        wait "$etcd_pid" 2>/dev/null || true
    fi
    rm -rf "$etcd_dir"
}
trap cleanup EXIT

# A random port in 20000-59999 that nothing on 127.0.0.1 answers on (bash's /dev/tcp: no extra
# tools needed on a fresh machine). etcd failing to bind anyway is handled by the retry below.
free_port() {
    local port
    while :; do
        port=$((20000 + RANDOM % 40000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/${port}") 2>/dev/null; then
            echo "$port"
            return
        fi
    done
}

# True if etcd's /health answers healthy (plain HTTP over bash's /dev/tcp; etcdctl is in another
# Debian package than the server).
etcd_healthy() {
    timeout 2 bash -c '
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" >&3
        grep -q "\"health\":\"true\"" <&3
    ' _ "$1" 2>/dev/null
}

start_etcd() {
    local client_port peer_port
    client_port="$(free_port)"
    peer_port="$(free_port)"
    endpoint="http://127.0.0.1:${client_port}"
    local peer="http://127.0.0.1:${peer_port}"
    rm -rf "$etcd_dir/data"
    etcd --name test --data-dir "$etcd_dir/data" \
        --listen-client-urls "$endpoint" --advertise-client-urls "$endpoint" \
        --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
        --initial-cluster "test=${peer}" --initial-cluster-state new \
        --heartbeat-interval 50 --election-timeout 500 \
        >"$etcd_dir/etcd.log" 2>&1 &
    etcd_pid=$!
    for _ in $(seq 1 100); do
        if ! kill -0 "$etcd_pid" 2>/dev/null; then
            wait "$etcd_pid" 2>/dev/null || true
            etcd_pid=""
            return 1
        fi
        if etcd_healthy "$client_port"; then
            return 0
        fi
        sleep 0.2
    done
    # Running but never healthy: stop it before a retry starts another.
    kill "$etcd_pid" 2>/dev/null || true
    wait "$etcd_pid" 2>/dev/null || true
    etcd_pid=""
    return 1
}

# A port probed free can be taken before etcd binds it: retry with new ports.
started=""
for _ in 1 2 3; do
    if start_etcd; then started=1; break; fi
done
if [ -z "$started" ]; then
    echo "test.sh: etcd did not start; log:" >&2
    tail -n 30 "$etcd_dir/etcd.log" >&2 || true
    exit 1
fi
export IDALLOC_TEST_ETCD="$endpoint"
echo "test.sh: etcd $(etcd --version | head -n1 | awk '{print $3}') at $IDALLOC_TEST_ETCD (pid $etcd_pid)" >&2

# --- checks ----------------------------------------------------------------------------------------
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
# The library's files import each other without cycles (layout tells the
# architecture). The self-test first: the check must be able to fail on planted cycles.
python3 scripts/check-imports.py --self-test
python3 scripts/check-imports.py
# Docs, comments, test names and generated pages speak of the project, not of how it was built
# (no work sessions, tracker numbers, branch names or team roles). Self-test first, as above.
python3 scripts/check-words.py --self-test
python3 scripts/check-words.py
# The book (docs/, book.toml) builds with no warning, and every internal link and anchor of it and of
# the README leads somewhere (mdbook checks neither anchors nor pages outside SUMMARY.md).
python3 scripts/check-links.py --self-test
python3 scripts/check-links.py
# The release binary carries no debug info (CI does not build a release to weigh it; the check
# reads the profile instead: scripts/check-release-profile.py says why that is enough).
python3 scripts/check-release-profile.py --self-test
python3 scripts/check-release-profile.py
book_log="$(mdbook build 2>&1)" || { echo "$book_log" >&2; exit 1; }
if grep -E 'WARN|ERROR' <<<"$book_log" >&2; then
    echo "test.sh: mdbook build printed warnings (above)" >&2
    exit 1
fi
# The API docs build without broken or private links (the crate docs carry the guarantee map).
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
# The public API of idalloc and idalloc-client against the last release's: a breaking change fails
# unless the version allows it (docs/design/compatibility.md). Self-test first: planted breaks of a
# small crate (a removed item, changed signatures, ...) must each be caught.
python3 scripts/public-api.py --self-test
python3 scripts/public-api.py
# The model checker (docs/design/model-checking.md) with its output, so that the state
# counts and the sabotage traces are in the log. `--workspace` resolves features as the workspace
# run below does, so nothing is compiled twice; that run leaves the model's crate out (its only
# tests are these), so nothing runs twice either.
cargo test --workspace --test model_check -- --nocapture
# idalloc-client speaks HTTP only: the library without its stores (cargo features `etcd` and
# `embedded`) is all it takes, so nothing of etcd-client, tonic or prost is in its tree and it
# builds without protoc.
if cargo tree -p idalloc-client -e normal,build --prefix none | grep -E '^(tonic|tonic-build|prost|prost-build|etcd-client) '; then
    echo "test.sh: idalloc-client depends on the crates above; it must not need etcd's gRPC stack" >&2
    exit 1
fi
PROTOC=/nonexistent cargo build -p idalloc-client --quiet
# The previous build's CLI for the mixed-build chaos test (crates/idalloc-chaos/tests/mixed_builds.rs),
# built once into target/prev/ (a few minutes, in a target directory of its own); without it
# that test says why and skips.
if prev_bin="$(scripts/build-previous.sh)"; then
    export IDALLOC_PREV_BIN="$prev_bin"
else
    echo "test.sh: no previous build; the mixed-build chaos test skips" >&2
fi
# The workspace run includes the 2-minute soak (crates/idalloc-chaos/tests/soak.rs;
# IDALLOC_SOAK_SECS sets its length): chaos load and faults plus serve, failing on resource growth.
# --no-fail-fast: one flaky or failing binary must not hide the results of the others.
status=0
cargo test --workspace --exclude idalloc-model --no-fail-fast "$@" || status=$?

# --- the Go and Python clients --------------------------------------------------------------------
# Both against a real serve (the idalloc binary the run above built) on this run's etcd, failover
# included; then the example agents of the Go, Python and Rust clients against one serve (and the
# Rust library's on its store), which
# must agree on every key's ID (clients/go/agents_test.go). Their caches and installs stay under
# target/, so a fresh clone needs nothing else.
cargo build --workspace --examples --quiet
root="$PWD"
export IDALLOC_BIN="$root/target/debug/idalloc" IDALLOC_RUST_AGENT="$root/target/debug/examples/agent"
export IDALLOC_RUST_LIB_AGENT="$root/target/debug/examples/lib_agent"
export GOCACHE="$root/target/go/cache" GOPATH="$root/target/go/path" GOPROXY=off
(cd clients/go && go vet ./... && go test -count=1 ./...) || status=$?
# The Python package, installed from its directory with pytest into a directory of its own (the
# system's Python is not changed); its tests import the installed package.
pydir="$root/target/python-client"
rm -rf "$pydir"
python3 -m pip install --quiet --target "$pydir" pytest ./clients/python \
    || python3 -m pip install --quiet --break-system-packages --target "$pydir" pytest ./clients/python
(cd clients/python && PYTHONPATH="$pydir" python3 -m pytest -q -p no:cacheprovider tests) || status=$?
exit "$status"
