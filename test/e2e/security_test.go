package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// writeCert makes a throwaway CA and a server certificate for 127.0.0.1
// and localhost, and returns the PEM file paths.
func writeCert(t *testing.T) (caFile, certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "memcgate test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("cert.pem", "CERTIFICATE", der), write("key.pem", "EC PRIVATE KEY", keyDER)
}

// TestTLSBothWays runs HTTPS on the data listener and TLS to a memcached
// started with --enable-ssl.
func TestTLSBothWays(t *testing.T) {
	caFile, certFile, keyFile := writeCert(t)
	mc := memcachedtest.Start(t, "-Z", "-o", "ssl_chain_cert="+certFile+",ssl_key="+keyFile)
	g := startGatewayScheme(t, "https", map[string]string{
		"MEMCGATE_SERVERS":              mc.Addr,
		"MEMCGATE_TLS_CERT_FILE":        certFile,
		"MEMCGATE_TLS_KEY_FILE":         keyFile,
		"MEMCGATE_UPSTREAM_TLS":         "true",
		"MEMCGATE_UPSTREAM_TLS_CA_FILE": caFile,
	})
	client := httpsClient(t, caFile)
	req, _ := http.NewRequest("PUT", g.URL+"/secret", strings.NewReader("over tls"))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("PUT over HTTPS: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Fatalf("PUT over HTTPS = %d, want 201", resp.StatusCode)
	}
	resp, err = client.Get(g.URL + "/secret")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "over tls" {
		t.Errorf("GET over HTTPS = %d %q, want 200 %q", resp.StatusCode, b, "over tls")
	}
	// Plain text to memcached's TLS port does not work: the value really
	// went over TLS.
	if _, err := memcachedtest.Stats(mc.Addr); err == nil {
		t.Error("plain-text stats to a TLS memcached answered; TLS is not really on")
	}
}

func httpsClient(t *testing.T, caFile string) *http.Client {
	t.Helper()
	pemBytes, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pemBytes)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

func TestTokensAndReadOnlyEndToEnd(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	tokFile := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(tokFile, []byte("# operators\nadmin:admin-token-0123456789\n"), 0o600)
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":          memcachedtest.Addrs(mcs),
		"MEMCGATE_AUTH_TOKENS":      "read:reader-token-0123456789,read+write:writer-token-0123456789",
		"MEMCGATE_AUTH_TOKENS_FILE": tokFile,
	})
	if r := g.do("PUT", "/k", []byte("v")); r.status != 401 {
		t.Errorf("PUT without a token = %d, want 401", r.status)
	}
	if r := g.do("PUT", "/k", []byte("v"), "Authorization", "Bearer reader-token-0123456789"); r.status != 403 {
		t.Errorf("PUT with a read token = %d, want 403", r.status)
	}
	if r := g.do("PUT", "/k", []byte("v"), "Authorization", "Bearer writer-token-0123456789"); r.status != 201 {
		t.Errorf("PUT with a write token = %d, want 201", r.status)
	}
	if r := g.do("GET", "/k", nil, "Authorization", "Bearer reader-token-0123456789"); r.status != 200 {
		t.Errorf("GET with a read token = %d, want 200", r.status)
	}
	req, _ := http.NewRequest("GET", g.Admin+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer admin-token-0123456789")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("GET /metrics with the admin token from the file = %v %v, want 200", resp, err)
	}
	if resp != nil {
		resp.Body.Close()
	}
}

// TestTLSHandshakeFailuresLogged: every connection to a TLS listener that
// does not complete a handshake (a port scan, a load balancer's TCP
// check, plain HTTP to the HTTPS port) was a warning line of its own, at
// whatever rate any client chose: 2,000 connections of 7 bytes from one
// client loop wrote 2,000 warnings (330 KB) in half a second, taking the
// room the log keeps for warnings and errors. They are counted, and
// logged a line a second at most.
func TestTLSHandshakeFailuresLogged(t *testing.T) {
	_, certFile, keyFile := writeCert(t)
	mcs := memcachedtest.StartN(t, 1)
	g := startGatewayScheme(t, "https", map[string]string{
		"MEMCGATE_SERVERS":       memcachedtest.Addrs(mcs),
		"MEMCGATE_TLS_CERT_FILE": certFile,
		"MEMCGATE_TLS_KEY_FILE":  keyFile,
	})
	const conns = 300
	for i := range conns {
		c, err := net.Dial("tcp", g.DataAddr)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n") // plain HTTP to the HTTPS port
		}
		c.Close()
	}
	var failed float64
	lines := 0 // the log is written out every 200 ms
	for deadline := time.Now().Add(10 * time.Second); (failed < conns || lines == 0) && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		failed, lines = handshakeFailures(t, g)["data"], strings.Count(g.Logs(), "TLS handshake error")
	}
	if failed != conns {
		t.Errorf("memcgate_http_tls_handshake_errors_total{listener=\"data\"} = %v, want %d", failed, conns)
	}
	// One line at the first failure, and one a second at most after it:
	// a slow run may take a second or two.
	if lines < 1 || lines > 3 {
		t.Errorf("%d log lines about %d failed TLS handshakes, want one a second at most:\n%s", lines, conns, gatewaytest.Tail(g.Logs(), 500))
	}
}

// handshakeFailures returns memcgate_http_tls_handshake_errors_total of
// g by listener.
func handshakeFailures(t *testing.T, g *gateway) map[string]float64 {
	t.Helper()
	text, err := g.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, `memcgate_http_tls_handshake_errors_total{listener="`)
		if !ok {
			continue
		}
		name, value, _ := strings.Cut(rest, `"} `)
		var v float64
		fmt.Sscan(value, &v)
		out[name] = v
	}
	return out
}

// TestTokenFileEmptyAtStart: a gateway started with a
// MEMCGATE_AUTH_TOKENS_FILE that gives no token (a secret not yet
// written, or a file emptied by mistake, which a reload refuses but a
// restart read) ran with no tokens: every client could write, delete,
// flush_all and read the admin listener. It now refuses every request
// that needs a scope, on both listeners, until a reload brings a token,
// and says so at start; probes still reach /healthz and /readyz.
func TestTokenFileEmptyAtStart(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	tokFile := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokFile, []byte("# written by the secrets agent\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":          memcachedtest.Addrs(mcs),
		"MEMCGATE_AUTH_TOKENS_FILE": tokFile,
		"MEMCGATE_WATCH_INTERVAL":   "100ms",
	})
	admin := func(path, token string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", g.Admin+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		method, path, body string
	}{
		{"PUT", "/k", "v"},
		{"GET", "/k", ""},
		{"DELETE", "/k", ""},
		{"POST", "/", `[{"op":"set","key":"k","value":"v"}]`},
		{"GET", "/memc?cmd=flush_all", ""},
		{"GET", "/memc?cmd=version", ""},
	} {
		var body []byte
		if c.body != "" {
			body = []byte(c.body)
		}
		if r := g.do(c.method, c.path, body); r.status != http.StatusUnauthorized {
			t.Errorf("%s %s with no token in the file = %d %q, want 401", c.method, c.path, r.status, r.body)
		}
	}
	for _, path := range []string{"/debug/config", "/metrics", "/debug/pprof/cmdline"} {
		if s := admin(path, ""); s != http.StatusUnauthorized {
			t.Errorf("admin %s with no token in the file = %d, want 401", path, s)
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if s := admin(path, ""); s != http.StatusOK {
			t.Errorf("admin %s = %d, want 200 (probes have no secrets)", path, s)
		}
	}
	const token = "writer-token-0123456789"
	writeAtomic(t, tokFile, "read+write:"+token+"\n")
	auth := []string{"Authorization", "Bearer " + token}
	for deadline := time.Now().Add(5 * time.Second); g.do("PUT", "/k", []byte("v"), auth...).status != http.StatusCreated; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the token written after the start was not taken within 5s:\n%s", gatewaytest.Tail(g.Logs(), 2000))
		}
	}
	if r := g.do("GET", "/k", nil); r.status != http.StatusUnauthorized {
		t.Errorf("GET without a token once the file has one = %d, want 401", r.status)
	}
	if !strings.Contains(g.Logs(), "AUTH_TOKENS_FILE gives no token") {
		t.Errorf("no warning at start that the token file gives no token:\n%s", gatewaytest.Tail(g.Logs(), 2000))
	}
}
