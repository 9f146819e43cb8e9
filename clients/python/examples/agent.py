#!/usr/bin/env python3
"""The example agent, written the same way in Rust (crates/idalloc-client/examples/agent.rs) and
Go (clients/go/examples/agent): open a session, acquire 100 keys on it, wait until the pool's
watch-fed view shows every one of them with the ID the service gave, print the IDs as one JSON
line, release the keys and end the session.

    idalloc --store memory: serve --listen 127.0.0.1:7379 &
    python3 examples/agent.py http://127.0.0.1:7379 agents
"""

import json
import os
import sys
import time

from idalloc_client import Client


def main() -> None:
    endpoints = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:7379"
    pool_name = sys.argv[2] if len(sys.argv) > 2 else "agents"
    c = Client(endpoints.split(","), token=os.environ.get("IDALLOC_TOKEN"))
    c.ensure_pool(pool_name, 1, 65535)
    pool = c.pool(pool_name)
    keys = [f"agent-key-{i:03d}" for i in range(100)]
    with pool.watch() as view, c.session(ttl=15) as session:
        ids = session.acquire_many(pool, keys)
        # Watch: the view shows every key with its ID (a bound for a loaded machine).
        if not view.wait_synced(60):
            sys.exit("the view did not sync within 60 s")
        deadline = time.monotonic() + 60
        while any(view.get(k) != i for k, i in ids.items()):
            if time.monotonic() > deadline:
                sys.exit("the view did not show every acquired key within 60 s")
            time.sleep(0.02)
        watched = sum(view.key_of(i) == k for k, i in ids.items())
        released = sum(session.release(pool, k).held for k in keys)
    print(json.dumps({"agent": "python", "pool": pool_name, "ids": ids, "watched": watched,
                      "released": released}), flush=True)


if __name__ == "__main__":
    main()
