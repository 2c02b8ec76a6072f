// Package dnstest answers DNS questions on a loopback UDP port for tests
// of MEMCGATE_SERVERS_DNS: SRV and A records that the test sets and
// changes while the gateway polls them, or SRV answers that take turns. Every other question gets an
// empty answer; a server that hangs answers none.
package dnstest

import (
	"bytes"
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

	mu    sync.Mutex // guards the fields below
	srv   [][]dnsmessage.SRVResource
	a     []dnsmessage.AResource
	turns map[string]int // SRV questions asked, by name
	hang  bool           // questions get no answer
	hold  bool           // questions are answered when Hold(false) is called
	held  []question     // the questions received while hold was on
	asked int            // questions received, answered or not
}

// question is one question held, and who asked it.
type question struct {
	msg  []byte
	from net.Addr
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
	s.alternate([][]SRV{recs})
}

// alternate makes the answers to SRV questions take turns among sets.
func (s *Server) alternate(sets [][]SRV) {
	out := make([][]dnsmessage.SRVResource, len(sets))
	for i, recs := range sets {
		for _, r := range recs {
			out[i] = append(out[i], dnsmessage.SRVResource{Target: dnsmessage.MustNewName(r.Target), Port: uint16(r.Port), Weight: 1})
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.srv = out
}

// AlternateLocalhost makes the answers to SRV questions take turns among
// sets of ports, each as SetLocalhost's: a name's first question gets
// the first set, its next one the second, and so on round; as
// round-robin DNS that cuts its answers, or a registry that drops a
// record from every other answer, do.
func (s *Server) AlternateLocalhost(sets ...[]int) {
	recs := make([][]SRV, len(sets))
	for i, ports := range sets {
		for _, p := range ports {
			recs[i] = append(recs[i], SRV{Target: "localhost.", Port: p})
		}
	}
	s.alternate(recs)
}

// SRVQuestions returns how many SRV questions for name (with its final
// ".") were answered.
func (s *Server) SRVQuestions(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.turns[name]
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

// Hang makes the server read questions and answer none (on), as a DNS
// server that stalls, or answer them again (off).
func (s *Server) Hang(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hang = on
}

// Hold makes the server keep the questions that come (on) and answer
// them when it is turned off, as a slow DNS server does: the asker is
// known to wait in its lookup meanwhile (Asked).
func (s *Server) Hold(on bool) {
	s.mu.Lock()
	s.hold = on
	var held []question
	if !on {
		held, s.held = s.held, nil
	}
	s.mu.Unlock()
	for _, q := range held {
		if out, ok := s.answer(q.msg); ok {
			_, _ = s.conn.WriteTo(out, q.from)
		}
	}
}

// Asked returns how many questions came, answered or not.
func (s *Server) Asked() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asked
}

func (s *Server) serve() {
	buf := make([]byte, 1500)
	for {
		n, addr, err := s.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		s.mu.Lock()
		s.asked++
		hang, hold := s.hang, s.hold
		if hold && !hang {
			s.held = append(s.held, question{msg: bytes.Clone(buf[:n]), from: addr})
		}
		s.mu.Unlock()
		if hang || hold {
			continue
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
		if s.turns == nil {
			s.turns = map[string]int{}
		}
		turn := s.turns[q.Name.String()]
		s.turns[q.Name.String()]++
		if len(s.srv) > 0 {
			for _, r := range s.srv[turn%len(s.srv)] {
				_ = b.SRVResource(rh, r)
			}
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
