package main

import (
	"net"
	"strconv"
	"strings"
	"testing"
)

// TestInheritedIPv6Only checks that a socket bound on every IPv6
// interface is taken for a configured address of every interface only
// if it takes IPv4 connections too: one that is IPv6 only
// (BindIPv6Only=ipv6-only in the socket unit, or the host's
// net.ipv6.bindv6only=1) would refuse PHP on 127.0.0.1.
func TestInheritedIPv6Only(t *testing.T) {
	v6only, err := net.Listen("tcp6", "[::]:0") // Go sets IPV6_V6ONLY on a tcp6 wildcard
	if err != nil {
		t.Skipf("no IPv6: %v", err)
	}
	defer v6only.Close()
	dual, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer dual.Close()
	if got := dual.Addr().(*net.TCPAddr).IP; got.To4() != nil {
		t.Skipf("the dual-stack listener is bound at %v, not [::]", got)
	}
	port := func(ln net.Listener) string { return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port) }
	tests := []struct {
		name    string
		ln      net.Listener
		addr    string
		wantErr string
	}{
		{"dual stack for :port", dual, ":" + port(dual), ""},
		{"dual stack for 0.0.0.0", dual, "0.0.0.0:" + port(dual), ""},
		{"dual stack for [::]", dual, "[::]:" + port(dual), ""},
		{"IPv6 only for :port", v6only, ":" + port(v6only), "for IPv6 only"},
		{"IPv6 only for 0.0.0.0", v6only, "0.0.0.0:" + port(v6only), "set BindIPv6Only=both"},
		{"IPv6 only for [::]", v6only, "[::]:" + port(v6only), "would refuse IPv4 clients"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := inheritedTCP(t.Context(), tt.ln, fdData, tt.addr, 0)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("inheritedTCP(%s, %q) = %v, want nil", tt.ln.Addr(), tt.addr, err)
				}
				c, err := net.Dial("tcp4", "127.0.0.1:"+port(tt.ln))
				if err != nil {
					t.Fatalf("the socket taken refuses IPv4: %v", err)
				}
				c.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("inheritedTCP(%s, %q) = %v, want an error with %q", tt.ln.Addr(), tt.addr, err, tt.wantErr)
			}
		})
	}
}
