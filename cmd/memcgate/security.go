package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/config"
	"github.com/memcgate/memcgate/gateway"
)

// security is what the configuration says about tokens and TLS, loaded
// once at start so that a bad file fails the start, not a request. The
// TLS listeners and the dialer to memcached read their certificates and
// CA bundle from certs, which a reload loads again from the same files
// (reloadTLS): a certificate renewed in place is in force from the
// reload on (docs/decisions/0094).
type security struct {
	tokens   gateway.Tokens
	noToken  bool        // a token file is named and gives no token: every request that needs a scope gets 401
	dataTLS  *tls.Config // nil: plain HTTP; its certificate is certs.data's
	adminTLS *tls.Config // nil: plain HTTP; its certificate is certs.admin's
	// dialer dials memcached; nil: plain TCP. Its TLS settings are
	// certs.upstream's.
	dialer func(ctx context.Context, network, address string) (net.Conn, error)
	certs  *tlsInForce
}

// tlsInForce is the TLS material in force: each listener's certificate
// and the settings of a TLS connection to memcached, nil where TLS is
// off. A reload swaps them; a connection keeps what it was made with.
type tlsInForce struct {
	data, admin atomic.Pointer[tls.Certificate]
	upstream    atomic.Pointer[tls.Config]
	expiry      *prometheus.Desc // memcgate_tls_certificate_expiry_timestamp_seconds
}

func newTLSInForce() *tlsInForce {
	return &tlsInForce{expiry: prometheus.NewDesc("memcgate_tls_certificate_expiry_timestamp_seconds",
		"When the certificate in force expires (its NotAfter), in seconds since the Unix epoch, by listener: data, admin, or upstream for MEMCGATE_UPSTREAM_TLS_CERT_FILE; one series per certificate configured. A reload puts a renewed one in force.",
		[]string{"listener"}, nil)}
}

// Describe implements prometheus.Collector.
func (t *tlsInForce) Describe(ch chan<- *prometheus.Desc) { ch <- t.expiry }

// Collect implements prometheus.Collector: the expiry of each
// certificate in force, so that one a renewal did not replace is seen
// before clients' handshakes fail on it.
func (t *tlsInForce) Collect(ch chan<- prometheus.Metric) {
	expiry := func(listener string, c *tls.Certificate) {
		if c != nil && c.Leaf != nil {
			ch <- prometheus.MustNewConstMetric(t.expiry, prometheus.GaugeValue, float64(c.Leaf.NotAfter.Unix()), listener)
		}
	}
	expiry("data", t.data.Load())
	expiry("admin", t.admin.Load())
	if up := t.upstream.Load(); up != nil && len(up.Certificates) > 0 {
		expiry("upstream", &up.Certificates[0])
	}
}

// tlsFiles is the TLS material cfg's files hold (loadTLS), nil where
// TLS is off.
type tlsFiles struct {
	data, admin *tls.Certificate
	upstream    *tls.Config
}

func newSecurity(cfg config.Config) (*security, error) {
	var s security
	toks, err := cfg.Tokens()
	if err != nil {
		return nil, err
	}
	s.tokens = gatewayTokens(toks, cfg.AuthTokensFile)
	s.noToken = len(toks) == 0 && cfg.AuthTokensFile != ""
	files, err := loadTLS(cfg)
	if err != nil {
		return nil, err
	}
	s.certs = newTLSInForce()
	s.certs.set(files)
	if files.data != nil {
		s.dataTLS = serverTLS(&s.certs.data)
	}
	if files.admin != nil {
		s.adminTLS = serverTLS(&s.certs.admin)
	}
	if files.upstream != nil {
		// The name is resolved on every dial (see upstream), and the TLS
		// handshake is part of the dial, so it counts against TIMEOUT.
		nd := &net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}
		certs := s.certs
		s.dialer = func(ctx context.Context, network, address string) (net.Conn, error) {
			d := &tls.Dialer{NetDialer: nd, Config: certs.upstream.Load()}
			return d.DialContext(ctx, network, address)
		}
	}
	return &s, nil
}

// loadTLS reads the TLS files cfg names: the listeners' certificates and
// keys, and memcached's CA bundle and client certificate.
func loadTLS(cfg config.Config) (tlsFiles, error) {
	var f tlsFiles
	var err error
	if f.data, err = serverCert(cfg.TLSCertFile, cfg.TLSKeyFile, "TLS_CERT_FILE"); err != nil {
		return tlsFiles{}, err
	}
	if f.admin, err = serverCert(cfg.AdminTLSCertFile, cfg.AdminTLSKeyFile, "ADMIN_TLS_CERT_FILE"); err != nil {
		return tlsFiles{}, err
	}
	if !cfg.UpstreamTLS {
		return f, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.UpstreamTLSName, InsecureSkipVerify: cfg.UpstreamTLSNoCheck}
	if cfg.UpstreamTLSCAFile != "" {
		pem, err := config.ReadFile(cfg.UpstreamTLSCAFile)
		if err != nil {
			return tlsFiles{}, fmt.Errorf("%sUPSTREAM_TLS_CA_FILE: %w", config.Prefix, err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return tlsFiles{}, fmt.Errorf("%sUPSTREAM_TLS_CA_FILE: no PEM certificate in %s", config.Prefix, cfg.UpstreamTLSCAFile)
		}
	}
	if cfg.UpstreamTLSCert != "" {
		cert, err := loadKeyPair(cfg.UpstreamTLSCert, cfg.UpstreamTLSKey)
		if err != nil {
			return tlsFiles{}, fmt.Errorf("%sUPSTREAM_TLS_CERT_FILE: %w", config.Prefix, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	f.upstream = tc
	return f, nil
}

// set puts f in force.
func (t *tlsInForce) set(f tlsFiles) {
	t.data.Store(f.data)
	t.admin.Store(f.admin)
	t.upstream.Store(f.upstream)
}

// reloadTLS loads cfg's TLS files again, cfg being the configuration
// the listeners and the dialer were made with (a reload does not change
// which files they are, nor turn TLS on or off), and puts them in force.
// It returns what puts back the ones it replaced, for a reload refused
// after it. If it fails, nothing changes.
func (s *security) reloadTLS(cfg config.Config) (undo func(), err error) {
	files, err := loadTLS(cfg)
	if err != nil {
		return nil, err
	}
	old := tlsFiles{data: s.certs.data.Load(), admin: s.certs.admin.Load(), upstream: s.certs.upstream.Load()}
	s.certs.set(files)
	return func() { s.certs.set(old) }, nil
}

// gatewayTokens maps the configured tokens onto the gateway's: each
// secret with the scopes of all its entries. With a token file named
// (file), a token is required even while none is configured: a file
// empty at start (a secret not yet written, one emptied by mistake and
// read by a restart) guards the listeners until a reload brings tokens,
// where it opened them to every client.
func gatewayTokens(toks []config.Token, file string) gateway.Tokens {
	secrets := make(map[string]gateway.Scope, len(toks))
	for _, t := range toks {
		var sc gateway.Scope
		if t.Read {
			sc |= gateway.ScopeRead
		}
		if t.Write {
			sc |= gateway.ScopeWrite
		}
		if t.Admin {
			sc |= gateway.ScopeAdmin
		}
		secrets[t.Secret] |= sc
	}
	if file != "" {
		return gateway.NewTokens(secrets).RequireToken()
	}
	return gateway.NewTokens(secrets)
}

// serverCert loads a listener's certificate and key; nil if certFile
// is empty (no TLS).
func serverCert(certFile, keyFile, name string) (*tls.Certificate, error) {
	if certFile == "" {
		return nil, nil
	}
	cert, err := loadKeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("%s%s: %w", config.Prefix, name, err)
	}
	return &cert, nil
}

// serverTLS is a TLS listener's configuration, whose certificate is the
// one in force at each handshake. ALPN offers HTTP/1.1 alone: a client
// offering h2 and http/1.1 is told which it gets, one offering h2 alone
// fails its handshake (docs/decisions/0038).
func serverTLS(cert *atomic.Pointer[tls.Certificate]) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert.Load(), nil }}
}

// loadKeyPair is tls.LoadX509KeyPair with the files read as the
// configuration's are (config.ReadFile): a reload loads them again to
// check them, and a named pipe put in their place would hold it.
func loadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	cert, err := config.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := config.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(cert, key)
}

// wrapData puts TLS on a data listener (TCP or the Unix socket) if the
// data API has a certificate.
func (s *security) wrapData(ln net.Listener) net.Listener {
	if s.dataTLS != nil {
		return tls.NewListener(ln, s.dataTLS)
	}
	return ln
}

// wrapAdmin puts TLS on the admin listener if it has a certificate.
func (s *security) wrapAdmin(ln net.Listener) net.Listener {
	if s.adminTLS != nil {
		return tls.NewListener(ln, s.adminTLS)
	}
	return ln
}
