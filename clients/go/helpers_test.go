package idalloc

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The tests run against a real `idalloc serve` on a real etcd: IDALLOC_BIN is the idalloc
// binary, IDALLOC_TEST_ETCD the etcd endpoint. Without them a test is skipped, except under CI
// (CI set), where a missing one fails.
func requireEnv(t *testing.T) (bin, etcd string) {
	t.Helper()
	bin, etcd = os.Getenv("IDALLOC_BIN"), os.Getenv("IDALLOC_TEST_ETCD")
	if bin == "" || etcd == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("IDALLOC_BIN (%q) and IDALLOC_TEST_ETCD (%q) are required under CI", bin, etcd)
		}
		t.Skip("IDALLOC_BIN and IDALLOC_TEST_ETCD not set")
	}
	return bin, etcd
}

// server is one `idalloc serve` process.
type server struct {
	t    *testing.T
	cmd  *exec.Cmd
	addr string
	done chan struct{}
}

// uniquePrefix is a store prefix no other test (or run) uses.
func uniquePrefix(t *testing.T) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("go-test-%s-%x", strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")), b)
}

// startServe starts `idalloc --store ETCD --prefix prefix serve --listen 127.0.0.1:0 args...`
// and waits for its "listening on" line; the process is killed when the test ends.
func startServe(t *testing.T, prefix string, args ...string) *server {
	t.Helper()
	bin, etcd := requireEnv(t)
	all := append([]string{"--store", etcd, "--prefix", prefix, "--timeout", "3s", "serve",
		"--listen", "127.0.0.1:0", "--sweep-interval", "1s"}, args...)
	cmd := exec.Command(bin, all...)
	cmd.Env = append(os.Environ(), "RUST_LOG=warn,idalloc::audit=off")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	s := &server{t: t, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	t.Cleanup(s.kill)
	lines := make(chan string, 1)
	go func() {
		r := bufio.NewReader(out)
		line, _ := r.ReadString('\n')
		lines <- line
		_, _ = r.WriteTo(discard{})
	}()
	select {
	case line := <-lines:
		addr := strings.TrimPrefix(strings.TrimSpace(line), "listening on ")
		if addr == strings.TrimSpace(line) {
			t.Fatalf("serve did not start: first line %q", line)
		}
		s.addr = addr
	case <-time.After(60 * time.Second):
		t.Fatal("serve printed nothing within 60s")
	}
	return s
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func (s *server) url(scheme string) string { return scheme + "://" + s.addr }

// kill stops the process with SIGKILL and reaps it.
func (s *server) kill() {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
	}
	<-s.done
}

func newClient(t *testing.T, opts Options) *Client {
	t.Helper()
	if opts.BackoffBase == 0 {
		opts.BackoffBase = 20 * time.Millisecond
		opts.BackoffMax = 200 * time.Millisecond
	}
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testCtx(t *testing.T) context.Context {
	// A bound for a loaded machine, not an expected duration.
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// until polls cond (every 20ms) until it holds or ctx ends; it reports whether it held.
func until(ctx context.Context, cond func() bool) bool {
	for {
		if cond() {
			return true
		}
		select {
		case <-ctx.Done():
			return cond()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// pki is a CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files.
type pki struct{ ca, serverCert, serverKey, clientCert, clientKey string }

func makePKI(t *testing.T, dir string) pki {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage, ip bool) (string, string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		if ip {
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
			tmpl.DNSNames = []string{"localhost"}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return write(cn+".crt", "CERTIFICATE", der), write(cn+".key", "PRIVATE KEY", kder)
	}
	p := pki{ca: write("ca.crt", "CERTIFICATE", caDER)}
	p.serverCert, p.serverKey = leaf(2, "server", x509.ExtKeyUsageServerAuth, true)
	p.clientCert, p.clientKey = leaf(3, "client", x509.ExtKeyUsageClientAuth, false)
	return p
}

func sha256Hex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}
