package e2e

import (
	"bytes"
	"crypto/tls"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// servedCert returns the certificate the TLS listener at addr presents.
func servedCert(t *testing.T, addr string) []byte {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("TLS dial %s: %v", addr, err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Raw
}

// replaceFile puts from's content at path, renamed over it, as a renewal
// (certbot, cert-manager) puts a new certificate in place.
func replaceFile(t *testing.T, from, path string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, path, string(b))
}

// TestRenewedCertificateServed: a certificate and its key renewed in
// place (the same paths, as certbot or cert-manager renew them) are
// served from the next reload on, by SIGHUP or by the watch poll, which
// watches the TLS files too, and the reload names them under changed.
// The watch case renews as a Kubernetes Secret volume does: both files
// in a new directory, a symbolic link swapped to it. Before, a reload
// loaded them only to check them, named nothing and went on serving the
// old certificate: a gateway renewed and reloaded served it until it
// expired, every client's handshake failing then.
func TestRenewedCertificateServed(t *testing.T) {
	mc := memcachedtest.Start(t)
	for _, tc := range []struct {
		name  string
		watch string // MEMCGATE_WATCH_INTERVAL
		hup   bool   // reload by SIGHUP, else by the watch poll
	}{
		{name: "sighup", watch: "0s", hup: true},
		{name: "watch", watch: "50ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// dir/live links to the directory of the files in force.
			dir := t.TempDir()
			live := filepath.Join(dir, "live")
			renew := func(version string) {
				t.Helper()
				_, cert, key := writeCert(t)
				v := filepath.Join(dir, version)
				if err := os.Mkdir(v, 0o700); err != nil {
					t.Fatal(err)
				}
				replaceFile(t, cert, filepath.Join(v, "cert.pem"))
				replaceFile(t, key, filepath.Join(v, "key.pem"))
				if err := os.Symlink(version, live+".new"); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(live+".new", live); err != nil {
					t.Fatal(err)
				}
			}
			renew("v1")
			certFile, keyFile := filepath.Join(live, "cert.pem"), filepath.Join(live, "key.pem")
			g := startGatewayScheme(t, "https", map[string]string{
				"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_WATCH_INTERVAL": tc.watch,
				"MEMCGATE_TLS_CERT_FILE": certFile, "MEMCGATE_TLS_KEY_FILE": keyFile,
			})
			old := servedCert(t, g.DataAddr)
			oks := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`)
			renew("v2")
			block, _ := pem.Decode([]byte(readFile(t, certFile)))
			if tc.hup {
				g.Signal(syscall.SIGHUP)
			}
			waitCounted(t, g, "ok", oks)
			got := servedCert(t, g.DataAddr)
			if bytes.Equal(got, old) {
				t.Fatalf("after the reload the data listener serves the certificate it started with, not the one renewed at %s:\n%s",
					certFile, gatewaytest.Tail(g.Logs(), 2000))
			}
			if !bytes.Equal(got, block.Bytes) {
				t.Errorf("after the reload the data listener serves a certificate other than the one at %s", certFile)
			}
			waitLog(t, g, "MEMCGATE_TLS_CERT_FILE")
			if v := metric(t, g, "memcgate_config_reloads_total", `{result="error"}`); v != 0 {
				t.Errorf("memcgate_config_reloads_total{result=\"error\"} = %v, want 0:\n%s", v, gatewaytest.Tail(g.Logs(), 2000))
			}
		})
	}
}

// TestRenewedUpstreamCA: a CA bundle of UPSTREAM_TLS_CA_FILE renewed in
// place (a CA added beside the old one) is the one a node added by the
// same reload is probed with: its memcached's certificate, signed by the
// new CA, passes, and it serves from the reload on. Before, the dialer
// kept the bundle it started with, and every node whose certificate
// came from the new CA stayed down, failing its handshake.
func TestRenewedUpstreamCA(t *testing.T) {
	ca1, cert1, key1 := writeCert(t)
	ca2, cert2, key2 := writeCert(t)
	a := memcachedtest.Start(t, "-Z", "-o", "ssl_chain_cert="+cert1+",ssl_key="+key1)
	b := memcachedtest.Start(t, "-Z", "-o", "ssl_chain_cert="+cert2+",ssl_key="+key2)
	dir := t.TempDir()
	caFile, servers := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "servers")
	replaceFile(t, ca1, caFile)
	writeAtomic(t, servers, a.Addr+"\n")
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS_FILE": servers, "MEMCGATE_WATCH_INTERVAL": "0s",
		"MEMCGATE_UPSTREAM_TLS": "true", "MEMCGATE_UPSTREAM_TLS_CA_FILE": caFile,
		"MEMCGATE_UPSTREAM_TLS_SERVER_NAME": "localhost",
	})
	bundle := readFile(t, ca1) + readFile(t, ca2)
	writeAtomic(t, caFile, bundle)
	writeAtomic(t, servers, a.Addr+"\n"+b.Addr+"\n")
	oks := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`)
	g.Signal(syscall.SIGHUP)
	waitCounted(t, g, "ok", oks)
	waitLog(t, g, "MEMCGATE_UPSTREAM_TLS_CA_FILE")
	if strings.Contains(g.Logs(), "nodes added start down") {
		t.Errorf("the node added started down: its probe did not use the renewed CA bundle:\n%s", gatewaytest.Tail(g.Logs(), 2000))
	}
	series := `{node="` + b.Addr + `"}`
	for deadline := time.Now().Add(10 * time.Second); metric(t, g, "memcgate_upstream_node_up", series) != 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the node whose certificate the renewed CA bundle signs is not up:\n%s", gatewaytest.Tail(g.Logs(), 2000))
		}
	}
	if r := g.do("PUT", "/renewed-ca", []byte("v")); r.status != 201 {
		t.Errorf("PUT through both nodes = %d %s, want 201", r.status, r.body)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
