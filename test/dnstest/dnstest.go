// Package dnstest answers DNS questions on a loopback UDP port for tests
// of MEMCGATE_SERVERS_DNS: SRV and A records that the test sets and
// changes while the gateway polls them. Every other question gets an
// empty answer.
package dnstest

import (
	"net"
	"net/netip"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// SRV is one SRV record's target (a name ending in ".", or "." alone)
// and port.
type SRV struct {
	Target string
	Port   int
}

// Server is a DNS server. Its methods are safe for concurrent use.
type Server struct {
	conn net.PacketConn

	mu  sync.Mutex // guards srv and a
	srv []dnsmessage.SRVResource
	a   []dnsmessage.AResource
}

// Start listens on a free loopback port and answers until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{conn: c}
	done := make(chan struct{})
	t.Cleanup(func() { c.Close(); <-done })
	go func() { defer close(done); s.serve() }()
	return s
}

// Addr is the server's host:port, for MEMCGATE_DNS_SERVER.
func (s *Server) Addr() string { return s.conn.LocalAddr().String() }

// SetSRV makes recs the answer to every SRV question.
func (s *Server) SetSRV(recs ...SRV) {
	out := make([]dnsmessage.SRVResource, len(recs))
	for i, r := range recs {
		out[i] = dnsmessage.SRVResource{Target: dnsmessage.MustNewName(r.Target), Port: uint16(r.Port), Weight: 1}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.srv = out
}

// SetLocalhost makes SRV records naming localhost. on ports the answer
// to every SRV question: nodes on this host, named as the ring hashes
// them (localhost:port).
func (s *Server) SetLocalhost(ports ...int) {
	recs := make([]SRV, len(ports))
	for i, p := range ports {
		recs[i] = SRV{Target: "localhost.", Port: p}
	}
	s.SetSRV(recs...)
}

// SetA makes addrs, IPv4 addresses, the answer to every A question.
func (s *Server) SetA(addrs ...string) {
	out := make([]dnsmessage.AResource, len(addrs))
	for i, a := range addrs {
		out[i] = dnsmessage.AResource{A: netip.MustParseAddr(a).As4()}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.a = out
}

func (s *Server) serve() {
	buf := make([]byte, 1500)
	for {
		n, addr, err := s.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		if out, ok := s.answer(buf[:n]); ok {
			_, _ = s.conn.WriteTo(out, addr)
		}
	}
}

// answer builds the reply to the question in msg.
func (s *Server) answer(msg []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil {
		return nil, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, false
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true})
	b.EnableCompression()
	_ = b.StartQuestions()
	_ = b.Question(q)
	_ = b.StartAnswers()
	rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}
	s.mu.Lock()
	switch q.Type {
	case dnsmessage.TypeSRV:
		for _, r := range s.srv {
			_ = b.SRVResource(rh, r)
		}
	case dnsmessage.TypeA:
		for _, r := range s.a {
			_ = b.AResource(rh, r)
		}
	}
	s.mu.Unlock()
	out, err := b.Finish()
	return out, err == nil
}
