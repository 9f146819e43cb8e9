package idalloc

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
)

// The example agents of the three clients (Go: examples/agent; Python:
// clients/python/examples/agent.py; Rust: crates/idalloc-client/examples/agent.rs, built by
// cargo, its path in IDALLOC_RUST_AGENT) and the library's (crates/idalloc/examples/lib_agent.rs,
// its path in IDALLOC_RUST_LIB_AGENT, on the serve's store and prefix directly) do the same job,
// one after the other, while a durable holder keeps the 100 keys bound: each must see the same
// ID for each key as the holder got, watch them all in its view, and release all 100 of its
// references.
func TestTheExampleAgentsAgree(t *testing.T) {
	rust, rustLib := os.Getenv("IDALLOC_RUST_AGENT"), os.Getenv("IDALLOC_RUST_LIB_AGENT")
	python, err := exec.LookPath("python3")
	if rust == "" || rustLib == "" || err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("IDALLOC_RUST_AGENT (%q), IDALLOC_RUST_LIB_AGENT (%q) and python3 (%v) are required under CI", rust, rustLib, err)
		}
		t.Skip("IDALLOC_RUST_AGENT or IDALLOC_RUST_LIB_AGENT not set, or no python3")
	}
	prefix := uniquePrefix(t)
	_, store := requireEnv(t)
	s := startServe(t, prefix)
	ctx := testCtx(t)
	c := newClient(t, Options{Endpoints: []string{s.url("http")}})
	if _, err := c.EnsurePool(ctx, PoolSpec{Name: "agents", Min: 1, Max: 65535}); err != nil {
		t.Fatal(err)
	}
	p, _ := c.Pool("agents")
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = fmt.Sprintf("agent-key-%03d", i)
	}
	pinned, err := p.AcquireManyDurable(ctx, "pin", keys)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{}
	for _, a := range pinned {
		want[a.Key] = a.ID
	}

	goAgent := filepath.Join(t.TempDir(), "agent")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", goAgent, "./examples/agent").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	pyDir, _ := filepath.Abs("../python")
	agents := map[string]*exec.Cmd{
		"go":           exec.CommandContext(ctx, goAgent, s.url("http"), "agents"),
		"rust":         exec.CommandContext(ctx, rust, s.url("http"), "agents"),
		"python":       exec.CommandContext(ctx, python, filepath.Join(pyDir, "examples", "agent.py"), s.url("http"), "agents"),
		"rust-library": exec.CommandContext(ctx, rustLib, store, prefix, "agents"),
	}
	agents["python"].Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(pyDir, "src"))
	for _, name := range []string{"go", "rust", "python", "rust-library"} {
		got := runAgent(ctx, t, name, agents[name])
		if got.Agent != name || got.Pool != "agents" || got.Watched != 100 || got.Released != 100 {
			t.Errorf("%s: %+v", name, got)
		}
		if !reflect.DeepEqual(got.IDs, want) {
			t.Errorf("%s: IDs differ from the holder's:\n%v\nwant %v", name, got.IDs, want)
		}
	}
	// Every agent released its references: only the pin holds the keys.
	bindings, err := p.List(ctx)
	if err != nil || len(bindings) != 100 {
		t.Fatal(len(bindings), err)
	}
	for _, b := range bindings {
		if !reflect.DeepEqual(b.Holders, []string{"pin"}) {
			t.Fatalf("%+v", b)
		}
	}
}

type agentLine struct {
	Agent    string            `json:"agent"`
	Pool     string            `json:"pool"`
	IDs      map[string]uint64 `json:"ids"`
	Watched  int               `json:"watched"`
	Released int               `json:"released"`
}

func runAgent(ctx context.Context, t *testing.T, name string, cmd *exec.Cmd) agentLine {
	t.Helper()
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the %s agent: %v\n%s", name, err, out)
	}
	var line agentLine
	if err := json.Unmarshal(out, &line); err != nil {
		t.Fatalf("the %s agent printed %q: %v", name, out, err)
	}
	return line
}
