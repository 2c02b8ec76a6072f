package liveconfig

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/memcgate/memcgate/config"
	"github.com/memcgate/memcgate/upstream/route"
)

// The names FuzzServersDNS looks up: the answers' compression pointers
// to the question (offset 12) read these.
const (
	fuzzSRVName = "_memcache._tcp.memcached.test."
	fuzzAName   = "memcached.test."
	fuzzMaxNode = 8
)

// rawDNS is a DNS server on a loopback port, UDP and TCP, that answers
// every question with the header flags, counts and sections after the
// question that the test sets, as bytes: whatever a broken or hostile
// server may send. Its answers carry the question's ID and the question
// itself, so that Go's resolver reads them rather than wait for another
// (a reply to another question is dropped as forged).
type rawDNS struct {
	udp net.PacketConn
	tcp net.Listener

	mu     sync.Mutex // guards answer
	answer rawAnswer
}

// rawAnswer is what follows a reply's ID: its flags (the QR bit is set
// always) and the counts of its answer, authority and additional
// sections, then body after the question.
type rawAnswer struct {
	flags, an, ns, ar uint16
	body              []byte
}

// maxRawBody keeps a reply within a UDP datagram.
const maxRawBody = 60000

// startRawDNS listens on a free loopback port, UDP and TCP on the same
// number (a truncated answer is asked again over TCP), until tb ends.
func startRawDNS(tb testing.TB) *rawDNS {
	tb.Helper()
	s := &rawDNS{}
	for range 20 {
		u, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		l, err := net.Listen("tcp", u.LocalAddr().String())
		if err != nil {
			u.Close()
			continue
		}
		s.udp, s.tcp = u, l
		break
	}
	if s.udp == nil {
		tb.Fatal("no loopback port free for UDP and TCP at once")
	}
	var wg sync.WaitGroup
	tb.Cleanup(func() { s.udp.Close(); s.tcp.Close(); wg.Wait() })
	wg.Go(s.serveUDP)
	wg.Go(func() { s.serveTCP(&wg) })
	return s
}

func (s *rawDNS) addr() string { return s.udp.LocalAddr().String() }

func (s *rawDNS) set(a rawAnswer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answer = a
}

func (s *rawDNS) serveUDP() {
	buf := make([]byte, 1500)
	for {
		n, from, err := s.udp.ReadFrom(buf)
		if err != nil {
			return
		}
		if out := s.reply(buf[:n]); out != nil {
			_, _ = s.udp.WriteTo(out, from)
		}
	}
}

func (s *rawDNS) serveTCP(wg *sync.WaitGroup) {
	for {
		c, err := s.tcp.Accept()
		if err != nil {
			return
		}
		wg.Go(func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			for {
				var n [2]byte
				if _, err := io.ReadFull(c, n[:]); err != nil {
					return
				}
				q := make([]byte, binary.BigEndian.Uint16(n[:]))
				if _, err := io.ReadFull(c, q); err != nil {
					return
				}
				out := s.reply(q)
				if out == nil {
					return
				}
				if _, err := c.Write(binary.BigEndian.AppendUint16(nil, uint16(len(out)))); err != nil {
					return
				}
				if _, err := c.Write(out); err != nil {
					return
				}
			}
		})
	}
}

// reply is the answer to query, or nil if query has no question.
func (s *rawDNS) reply(query []byte) []byte {
	if len(query) < 12 {
		return nil
	}
	end := 12 // past the question's name, its labels as Go writes them: uncompressed
	for end < len(query) && query[end] != 0 {
		end += 1 + int(query[end])
	}
	end += 1 + 4 // the root label, type and class
	if end > len(query) {
		return nil
	}
	s.mu.Lock()
	a := s.answer
	s.mu.Unlock()
	out := make([]byte, 0, end+len(a.body))
	out = append(out, query[0], query[1])
	out = binary.BigEndian.AppendUint16(out, a.flags|1<<15)
	out = binary.BigEndian.AppendUint16(out, 1)
	out = binary.BigEndian.AppendUint16(out, a.an)
	out = binary.BigEndian.AppendUint16(out, a.ns)
	out = binary.BigEndian.AppendUint16(out, a.ar)
	out = append(out, query[12:end]...)
	return append(out, a.body[:min(len(a.body), maxRawBody)]...)
}

// realAnswer builds an answer as a DNS server sends it to the question
// name of type qt (its compression pointers reach the question at offset
// 12), and returns it as a rawAnswer.
func realAnswer(tb testing.TB, name string, qt dnsmessage.Type, h dnsmessage.Header, build func(b *dnsmessage.Builder, rh dnsmessage.ResourceHeader)) rawAnswer {
	tb.Helper()
	h.Response = true
	b := dnsmessage.NewBuilder(nil, h)
	b.EnableCompression()
	q := dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: qt, Class: dnsmessage.ClassINET}
	if err := b.StartQuestions(); err != nil {
		tb.Fatal(err)
	}
	if err := b.Question(q); err != nil {
		tb.Fatal(err)
	}
	if err := b.StartAnswers(); err != nil {
		tb.Fatal(err)
	}
	build(&b, dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 30})
	msg, err := b.Finish()
	if err != nil {
		tb.Fatal(err)
	}
	qlen := len(name) + 1 + 4 // the name's labels and root, type, class
	return rawAnswer{
		flags: binary.BigEndian.Uint16(msg[2:]) &^ (1 << 15),
		an:    binary.BigEndian.Uint16(msg[6:]), ns: binary.BigEndian.Uint16(msg[8:]), ar: binary.BigEndian.Uint16(msg[10:]),
		body: msg[12+qlen:],
	}
}

// dnsSeeds are answers built as DNS servers lay them out (kube-dns for
// a headless Service's SRV records, with the pods' addresses beside
// them; A records of round-robin DNS; NXDOMAIN; records of TTL 0), a
// truncated one asked again over TCP, one of thousands of records, and
// some that no server should send.
func dnsSeeds(tb testing.TB) []struct {
	srv bool
	a   rawAnswer
} {
	aa := dnsmessage.Header{Authoritative: true, RecursionDesired: true, RecursionAvailable: true}
	srvRecs := func(n int, port uint16) func(*dnsmessage.Builder, dnsmessage.ResourceHeader) {
		return func(b *dnsmessage.Builder, rh dnsmessage.ResourceHeader) {
			for i := range n {
				t := dnsmessage.MustNewName("memcached-" + strconv.Itoa(i) + ".memcached.default.svc.cluster.local.")
				_ = b.SRVResource(rh, dnsmessage.SRVResource{Priority: 0, Weight: 33, Port: port, Target: t})
			}
			_ = b.StartAdditionals()
			for i := range min(n, 20) {
				ah := rh
				ah.Name = dnsmessage.MustNewName("memcached-" + strconv.Itoa(i) + ".memcached.default.svc.cluster.local.")
				_ = b.AResource(ah, dnsmessage.AResource{A: [4]byte{10, 244, 1, byte(i)}})
			}
		}
	}
	aRecs := func(n int) func(*dnsmessage.Builder, dnsmessage.ResourceHeader) {
		return func(b *dnsmessage.Builder, rh dnsmessage.ResourceHeader) {
			for i := range n {
				_ = b.AResource(rh, dnsmessage.AResource{A: [4]byte{10, 0, byte(i >> 8), byte(i)}})
			}
		}
	}
	cname := func(b *dnsmessage.Builder, rh dnsmessage.ResourceHeader) {
		_ = b.CNAMEResource(rh, dnsmessage.CNAMEResource{CNAME: rh.Name}) // a name pointing to itself
	}
	type seed = struct {
		srv bool
		a   rawAnswer
	}
	seeds := []seed{
		{true, realAnswer(tb, fuzzSRVName, dnsmessage.TypeSRV, aa, srvRecs(3, 11211))},
		{true, realAnswer(tb, fuzzSRVName, dnsmessage.TypeSRV, aa, srvRecs(fuzzMaxNode+1, 11211))},
		{true, realAnswer(tb, fuzzSRVName, dnsmessage.TypeSRV, aa, srvRecs(3000, 11211))},
		{true, realAnswer(tb, fuzzSRVName, dnsmessage.TypeSRV, aa, srvRecs(2, 0))},
		{true, realAnswer(tb, fuzzSRVName, dnsmessage.TypeSRV, aa, cname)},
		{false, realAnswer(tb, fuzzAName, dnsmessage.TypeA, aa, aRecs(3))},
		{false, realAnswer(tb, fuzzAName, dnsmessage.TypeA, aa, func(b *dnsmessage.Builder, rh dnsmessage.ResourceHeader) {
			rh.TTL = 0
			aRecs(2)(b, rh)
		})},
		{false, realAnswer(tb, fuzzAName, dnsmessage.TypeA, aa, aRecs(4000))},
		{false, realAnswer(tb, fuzzAName, dnsmessage.TypeA, dnsmessage.Header{RCode: dnsmessage.RCodeNameError, RecursionAvailable: true}, func(*dnsmessage.Builder, dnsmessage.ResourceHeader) {})},
		{false, realAnswer(tb, fuzzAName, dnsmessage.TypeA, aa, cname)},
	}
	trunc := realAnswer(tb, fuzzSRVName, dnsmessage.TypeSRV, aa, srvRecs(60, 11211))
	trunc.flags |= 1 << 9 // TC: asked again over TCP, answered in full
	seeds = append(seeds, seed{true, trunc})
	loop := seeds[0].a
	loop.body = slices.Clone(loop.body)
	loop.body[0], loop.body[1] = 0xc0, byte(12+len(fuzzSRVName)+1+4) // the first answer's name points at itself
	seeds = append(seeds, seed{true, loop})
	over := seeds[5].a
	over.an = 0xffff // more records said than sent
	return append(seeds, seed{false, over})
}

// FuzzServersDNS: whatever a DNS server answers for SERVERS_DNS (any
// flags and counts, any records after the question: truncated,
// compression loops, counts past the records, thousands of records,
// names pointing to themselves, TTL 0), nothing panics; the nodes taken
// are at most MAX_NODES, each once, each a node SERVERS would accept as
// written; an answer refused names the name looked up; and a running
// gateway's poll that gets it keeps the nodes it ran, unless the answer
// gave valid ones. Seeds are answers laid out as DNS servers send them.
func FuzzServersDNS(f *testing.F) {
	for _, s := range dnsSeeds(f) {
		f.Add(s.srv, s.a.flags, s.a.an, s.a.ns, s.a.ar, s.a.body)
	}
	dns := startRawDNS(f)
	good := dnsSeeds(f)
	environs := func(srv bool) (environ map[string]string, host string) {
		name, host := fuzzAName+":11211", strings.TrimSuffix(fuzzAName, ".")
		if srv {
			name, host = fuzzSRVName, fuzzSRVName
		}
		return map[string]string{
			"MEMCGATE_SERVERS_DNS": name, "MEMCGATE_DNS_SERVER": dns.addr(),
			"MEMCGATE_MAX_NODES": strconv.Itoa(fuzzMaxNode),
		}, host
	}
	// The running gateway's configuration, from a real first answer: the
	// same at every execution, so loaded once for each kind of record (a
	// third of an execution's lookups and loads), and each execution's
	// reloader starts from a copy of it.
	starts := map[bool]config.Config{}
	for srv, first := range map[bool]rawAnswer{false: good[5].a, true: good[0].a} {
		environ, _ := environs(srv)
		dns.set(first)
		start, err := Load(f.Context(), environ)
		if err != nil {
			f.Fatalf("the first answer, a real one (SRV %v): %v", srv, err)
		}
		starts[srv] = start
	}
	f.Fuzz(func(t *testing.T, srv bool, flags, an, ns, ar uint16, body []byte) {
		environ, host := environs(srv)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()

		start := starts[srv]
		start.Servers = slices.Clone(start.Servers)
		r := New(start, Options{Environ: environ, Log: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
			Apply: func(context.Context, Update) ([]route.Change, error) { return nil, nil }})

		dns.set(rawAnswer{flags: flags, an: an, ns: ns, ar: ar, body: body})
		cfg, err := Load(ctx, environ)
		if err != nil {
			if !strings.Contains(err.Error(), host) {
				t.Errorf("an answer refused: %v; the error does not name %s, the name looked up", err, host)
			}
		} else {
			checkNodes(t, "an answer taken", cfg.Servers)
		}
		r.reload(ctx, "dns")
		got := r.Current().Servers
		if h := r.History(); len(h) > 0 && h[0].Result == "error" {
			if !slices.Equal(got, start.Servers) {
				t.Errorf("a poll refused %q, and the nodes went from %v to %v", h[0].Error, start.Servers, got)
			}
			return
		}
		checkNodes(t, "a poll's nodes", got)
	})
}

// checkNodes fails t unless servers are 1 to fuzzMaxNode nodes, each
// once, each read back as written (as /debug/config shows them).
func checkNodes(t *testing.T, what string, servers []config.Server) {
	t.Helper()
	if len(servers) == 0 || len(servers) > fuzzMaxNode {
		t.Fatalf("%s: %d nodes, want 1 to %d: %v", what, len(servers), fuzzMaxNode, servers)
	}
	seen := map[string]bool{}
	for _, s := range servers {
		if seen[s.Addr()] {
			t.Errorf("%s: %s twice", what, s.Addr())
		}
		seen[s.Addr()] = true
		back, err := config.ParseServer(s.String())
		if err != nil || back != s {
			t.Errorf("%s: %+v reads back from %q as %+v, %v", what, s, s.String(), back, err)
		}
	}
}
