package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"time"

	"github.com/memcgate/memcgate/config"
	"github.com/memcgate/memcgate/gateway"
)

// security is what the configuration says about tokens and TLS, loaded
// once at start so that a bad file fails the start, not a request.
type security struct {
	tokens   gateway.Tokens
	noToken  bool        // a token file is named and gives no token: every request that needs a scope gets 401
	dataTLS  *tls.Config // nil: plain HTTP
	adminTLS *tls.Config
	dialer   func(ctx context.Context, network, address string) (net.Conn, error) // nil: plain TCP
}

func newSecurity(cfg config.Config) (*security, error) {
	var s security
	toks, err := cfg.Tokens()
	if err != nil {
		return nil, err
	}
	s.tokens = gatewayTokens(toks, cfg.AuthTokensFile)
	s.noToken = len(toks) == 0 && cfg.AuthTokensFile != ""
	if s.dataTLS, err = serverTLS(cfg.TLSCertFile, cfg.TLSKeyFile, "TLS_CERT_FILE"); err != nil {
		return nil, err
	}
	if s.adminTLS, err = serverTLS(cfg.AdminTLSCertFile, cfg.AdminTLSKeyFile, "ADMIN_TLS_CERT_FILE"); err != nil {
		return nil, err
	}
	if cfg.UpstreamTLS {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.UpstreamTLSName, InsecureSkipVerify: cfg.UpstreamTLSNoCheck}
		if cfg.UpstreamTLSCAFile != "" {
			pem, err := config.ReadFile(cfg.UpstreamTLSCAFile)
			if err != nil {
				return nil, fmt.Errorf("%sUPSTREAM_TLS_CA_FILE: %w", config.Prefix, err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("%sUPSTREAM_TLS_CA_FILE: no PEM certificate in %s", config.Prefix, cfg.UpstreamTLSCAFile)
			}
		}
		if cfg.UpstreamTLSCert != "" {
			cert, err := loadKeyPair(cfg.UpstreamTLSCert, cfg.UpstreamTLSKey)
			if err != nil {
				return nil, fmt.Errorf("%sUPSTREAM_TLS_CERT_FILE: %w", config.Prefix, err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		// The name is resolved on every dial (see upstream), and the TLS
		// handshake is part of the dial, so it counts against TIMEOUT.
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}, Config: tc}
		s.dialer = d.DialContext
	}
	return &s, nil
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

func serverTLS(certFile, keyFile, name string) (*tls.Config, error) {
	if certFile == "" {
		return nil, nil
	}
	cert, err := loadKeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("%s%s: %w", config.Prefix, name, err)
	}
	// ALPN offers HTTP/1.1 alone: a client offering h2 and http/1.1 is
	// told which it gets, one offering h2 alone fails its handshake
	// (docs/decisions/0038).
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}, nil
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
