package deploy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestTLSCertificateExpiry: the binary with a TLS data listener exports
// memcgate_tls_certificate_expiry_timestamp_seconds{listener="data"},
// its certificate's NotAfter, which is what MemcgateTLSCertificateExpiring
// (checked here through promtool's rule unit tests) watches: it fires
// for a certificate 10 days from its expiry, an hour on, and not for one
// 30 days from it. Before, nothing told a certificate whose renewal did
// not come, or was not reloaded, until every client's handshake failed.
func TestTLSCertificateExpiry(t *testing.T) {
	notAfter := time.Now().Add(10 * 24 * time.Hour).Truncate(time.Second)
	cert, key := writeSelfSigned(t, notAfter)
	g := gatewaytest.New(t, binary, map[string]string{
		"MEMCGATE_SERVERS":       memcachedtest.Start(t).Addr,
		"MEMCGATE_TLS_CERT_FILE": cert,
		"MEMCGATE_TLS_KEY_FILE":  key,
		"MEMCGATE_DRAIN_DELAY":   "0s",
	})
	g.Start(t)
	text, err := g.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	series := `memcgate_tls_certificate_expiry_timestamp_seconds{listener="data"} `
	var got string
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series); ok {
			got = v
		}
	}
	for m := range tlsOnly {
		if !strings.Contains(text, "\n"+m+"{") {
			t.Errorf("%s is not exported with a TLS data listener", m)
		}
	}
	if v, err := strconv.ParseFloat(got, 64); err != nil || int64(v) != notAfter.Unix() {
		t.Errorf("%s= %q, want %d (the certificate's NotAfter)", series, got, notAfter.Unix())
	}

	testAlertRules(t, `tests:
  - interval: 1m
    input_series:
      # Unix times, evaluated at 0 to 2h: 10 days and 30 days ahead.
      - series: 'memcgate_tls_certificate_expiry_timestamp_seconds{instance="gw1:9090",listener="data"}'
        values: '864000x120'
      - series: 'memcgate_tls_certificate_expiry_timestamp_seconds{instance="gw1:9090",listener="admin"}'
        values: '2592000x120'
    alert_rule_test:
      - eval_time: 30m
        alertname: MemcgateTLSCertificateExpiring
        exp_alerts: []
      - eval_time: 90m
        alertname: MemcgateTLSCertificateExpiring
        exp_alerts:
          - exp_labels: {severity: warning, instance: "gw1:9090", listener: "data"}
            exp_annotations:
              runbook_url: "https://github.com/memcgate/memcgate/blob/main/docs/runbook.md#memcgatetlscertificateexpiring"
              summary: "memcgate gw1:9090: the data certificate expires in 9d 22h 30m 0s"
              description: "The certificate the gateway has in force was not renewed, or its renewal was not reloaded. Renew the file in place and reload (systemctl reload memcgate, or SIGHUP; the watch poll takes it within MEMCGATE_WATCH_INTERVAL); the reload's log line names it under changed."
`)
}

// writeSelfSigned writes a self-signed certificate for 127.0.0.1 that
// expires at notAfter, and its key, and returns their paths.
func writeSelfSigned(t *testing.T, notAfter time.Time) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "memcgate test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("cert.pem", "CERTIFICATE", der), write("key.pem", "EC PRIVATE KEY", keyDER)
}
