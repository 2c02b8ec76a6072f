package hashring

// Interop tests against the real PHP extensions: pecl/memcache's
// Memcache::findServer for the Memcache class, and each session handler
// writing sessions to real memcached servers for the session
// distributions. make test installs php-cli, php-memcache and
// php-memcached; without them these tests skip, or fail when CI or
// MEMCGATE_TEST_REQUIRE_MEMCACHED is set (gatewaytest.PHP).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// runPHPScript runs script with php options (-d …) before it and args
// after it, feeding it stdin, and returns its output; anything on standard
// error (a PHP warning) fails t.
func runPHPScript(t *testing.T, php, script, stdin string, opts []string, args ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "script.php")
	if err := os.WriteFile(path, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	cmdArgs := append([]string{"-d", "display_errors=stderr", "-d", "error_reporting=-1", "-d", "log_errors=0"}, opts...)
	cmd := exec.CommandContext(t.Context(), php, append(append(cmdArgs, path), args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil || stderr.Len() > 0 {
		t.Fatalf("php %v: %v\nstderr: %.2000s", opts, err, stderr.Bytes())
	}
	return stdout.String()
}

// peclFindScript prints, for each key on stdin (one per line), the server
// Memcache::findServer picks, as "host:port". argv[1] is a JSON object
// {"strategy": "standard"|"consistent", "hash": "crc32"|"fnv",
// "servers": [[host, port, weight, up]…]}; a server with up false is added
// as failed for good (status false, retry_interval -1), so findServer
// answers with pecl/memcache's failover choice.
const peclFindScript = `<?php
$cfg = json_decode($argv[1], true, 512, JSON_THROW_ON_ERROR);
ini_set('memcache.hash_strategy', $cfg['strategy']);
ini_set('memcache.hash_function', $cfg['hash']);
$m = new Memcache();
foreach ($cfg['servers'] as [$host, $port, $weight, $up]) {
    if (!$m->addServer($host, $port, false, $weight, 1, $up ? 15 : -1, $up)) {
        fwrite(STDERR, "addServer $host:$port failed\n");
        exit(2);
    }
}
while (($line = fgets(STDIN)) !== false) {
    echo $m->findServer(substr($line, 0, -1)), "\n";
}
`

// peclStrategies maps the Memcache-class distributions to their ini
// settings.
func peclStrategies() []struct {
	d              Distribution
	strategy, hash string
} {
	return []struct {
		d              Distribution
		strategy, hash string
	}{
		{PeclStandardCRC32, "standard", "crc32"},
		{PeclStandardFNV, "standard", "fnv"},
		{PeclConsistentCRC32, "consistent", "crc32"},
		{PeclConsistentFNV, "consistent", "fnv"},
	}
}

func memberName(m Member) string { return m.Host + ":" + strconv.Itoa(m.Port) }

// peclQuiet silences E_DEPRECATED: pecl/memcache 4.0.5.2 on PHP 8.2 warns
// "Creation of dynamic property Memcache::$connection is deprecated" on
// every first addServer and session open. Every other message still fails
// the test.
func peclQuiet() []string { return []string{"-d", "error_reporting=E_ALL & ~E_DEPRECATED"} }

// TestPeclInterop compares Owner with pecl/memcache's findServer for random
// keys in every strategy and hash function, and the first live member of
// Owners with findServer when one server is marked failed. When none of
// the 20 rehashed candidates is live, pecl/memcache gives up and answers
// the last candidate, the failed server, where the request then fails;
// Owners goes on to the other members instead, so for those keys the test
// checks that pecl/memcache did give up.
func TestPeclInterop(t *testing.T) {
	php := gatewaytest.PHP(t, "memcache")
	configs := []struct {
		name string
		ms   []Member
	}{
		{"3 servers 1,2,1", []Member{
			{"10.0.0.1", 11211, 1}, {"cache-b.example", 11212, 2}, {"10.0.0.3", 11211, 1},
		}},
		{"5 servers 1,3,1,2,5", []Member{
			{"10.0.0.1", 11211, 1}, {"cache-b.example", 11211, 3}, {"10.0.0.3", 11212, 1},
			{"memcached-d", 22122, 2}, {"192.168.7.20", 11211, 5},
		}},
	}
	const n = 10000
	keys := interopKeys(n, 20260601)
	for _, c := range configs {
		for _, s := range peclStrategies() {
			for _, down := range []int{-1, 1} {
				name := c.name + "/" + string(s.d)
				if down >= 0 {
					name += "/member 1 failed"
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					servers := make([][]any, len(c.ms))
					for i, m := range c.ms {
						servers[i] = []any{m.Host, m.Port, m.Weight, i != down}
					}
					cfg, _ := json.Marshal(map[string]any{"strategy": s.strategy, "hash": s.hash, "servers": servers})
					out := runPHPScript(t, php, peclFindScript, strings.Join(keys, "\n")+"\n", peclQuiet(), string(cfg))
					want := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
					if len(want) != len(keys) {
						t.Fatalf("php printed %d lines for %d keys", len(want), len(keys))
					}
					r := mustNew(t, s.d, c.ms)
					mismatches, gaveUp := 0, 0
					for i, k := range keys {
						got := r.Owner(k)
						for m := range r.Owners(k) {
							if m != down {
								got = m
								break
							}
						}
						if cands := peclCandidates(r, k); down >= 0 && !slices.ContainsFunc(cands, func(m int) bool { return m != down }) {
							gaveUp++
							got = cands[len(cands)-1]
						}
						if g := memberName(c.ms[got]); g != want[i] {
							if mismatches++; mismatches <= 5 {
								t.Errorf("Owner(%q) = %s, pecl/memcache says %s", k, g, want[i])
							}
						}
					}
					t.Logf("%s: %d keys compared with pecl/memcache findServer, %d mismatches (%d where pecl/memcache gave up)", name, len(keys), mismatches, gaveUp)
				})
			}
		}
	}
}

// sessionScript writes one session per id on stdin (one per line) through
// the session handler configured by the -d options, storing the id itself.
const sessionScript = `<?php
ini_set('session.use_cookies', '0');
ini_set('session.use_strict_mode', '0');
ini_set('session.cache_limiter', '');
$n = 0;
while (($line = fgets(STDIN)) !== false) {
    session_id(substr($line, 0, -1));
    if (!session_start()) { fwrite(STDERR, "session_start failed\n"); exit(1); }
    $_SESSION['id'] = session_id();
    if (!session_write_close()) { fwrite(STDERR, "session_write_close failed\n"); exit(1); }
    $n++;
}
echo $n;
`

// sessionIDs returns n distinct random session ids: 20 to 64 characters
// of the alphabet PHP accepts in ids (a-z A-Z 0-9 , -).
func sessionIDs(n int, seed uint64) []string {
	const chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789,-"
	rng := rand.New(rand.NewPCG(seed, 0x73657373))
	seen := map[string]bool{}
	ids := make([]string, 0, n)
	for len(ids) < n {
		b := make([]byte, 20+rng.IntN(45))
		for i := range b {
			b[i] = chars[rng.IntN(len(chars))]
		}
		if id := string(b); !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}

// holders returns, for each key, the indexes of the servers that hold it.
func holders(t *testing.T, servers []*memcachedtest.Server, keys []string) map[string][]int {
	t.Helper()
	out := map[string][]int{}
	for i, s := range servers {
		c := memcache.New(s.Addr)
		c.Timeout = 5 * time.Second
		for start := 0; start < len(keys); start += 500 {
			got, err := c.GetMulti(keys[start:min(start+500, len(keys))])
			if err != nil {
				t.Fatalf("get from %s: %v", s.Addr, err)
			}
			for k := range got {
				out[k] = append(out[k], i)
			}
		}
		c.Close()
	}
	return out
}

// writeSessions has PHP write a session for every id with the given
// handler options and returns where each one landed.
func writeSessions(t *testing.T, php string, servers []*memcachedtest.Server, ids []string, prefix string, opts []string) map[string][]int {
	t.Helper()
	out := runPHPScript(t, php, sessionScript, strings.Join(ids, "\n")+"\n", opts)
	if out != strconv.Itoa(len(ids)) {
		t.Fatalf("php wrote %s sessions, want %d", out, len(ids))
	}
	got := holders(t, servers, prefixed(prefix, ids))
	placed := make(map[string][]int, len(ids))
	for _, id := range ids {
		placed[id] = got[prefix+id]
	}
	return placed
}

func prefixed(prefix string, ids []string) []string {
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = prefix + id
	}
	return keys
}

// checkSessions has PHP write a session for every id and fails t for each
// one not on exactly the servers want names, in any order. A session found
// elsewhere is deleted everywhere and written again, up to sessionRetries
// times, and only a miss every time fails: placement is a pure function of
// the id, but a PHP client that finds a server slow on a loaded machine
// fails over to the next one for its retry interval, and that is no
// placement bug. The count of such transient misses is logged.
func checkSessions(t *testing.T, php string, servers []*memcachedtest.Server, ids []string, prefix string, opts []string, want func(id string) []int) {
	t.Helper()
	misplaced := func(got map[string][]int, ids []string) []string {
		var out []string
		for _, id := range ids {
			if !slices.Equal(slices.Sorted(slices.Values(got[id])), slices.Sorted(slices.Values(want(id)))) {
				out = append(out, id)
			}
		}
		return out
	}
	first := misplaced(writeSessions(t, php, servers, ids, prefix, opts), ids)
	if len(first) == 0 {
		t.Logf("%d sessions written by PHP, all where the distribution says", len(ids))
		return
	}
	if len(first) > len(ids)/100 {
		t.Errorf("%d of %d sessions not where the distribution says, %q first; not retried", len(first), len(ids), first[0])
		return
	}
	// A miss that repeats is a placement bug; a client failover is not
	// repeatable, though the condition behind it (a server starved of CPU
	// on a loaded machine) can outlast one rewrite. So each rewrite waits
	// a little longer first, and only a miss in all of them fails.
	still := first
	var again map[string][]int
	for round := range sessionRetries {
		time.Sleep(time.Duration(round+1) * 500 * time.Millisecond)
		deleteSessions(t, servers, prefixed(prefix, still))
		again = writeSessions(t, php, servers, still, prefix, opts)
		if still = misplaced(again, still); len(still) == 0 {
			break
		}
	}
	for i, id := range still {
		if i == 5 {
			break
		}
		t.Errorf("session %q is on %v, want %v, in each of %d rewrites", id, again[id], want(id), sessionRetries)
	}
	t.Logf("%d sessions written by PHP: %d misplaced only transiently (a client failover), %d every time", len(ids), len(first)-len(still), len(still))
}

// sessionRetries is how many times checkSessions rewrites a misplaced
// session before it calls the placement wrong.
const sessionRetries = 3

// peclSessionCount is how many random session ids TestPeclSessionInterop
// writes per server set and distribution. pecl/memcache's session handler
// hashes with the Memcache class's pool, so its points, buckets, weights
// and "key-N" candidates are compared with findServer on 10,000 keys per
// distribution (TestPeclInterop, a failed member making findServer walk
// the candidates), where a lookup costs next to nothing. What the
// sessions add is which candidates the handler asks for, in which order,
// and which servers its save_path names: a mistake there misplaces a
// whole member's share of the ids, hundreds of 2,000, not a rare few.
// A session costs a PHP session start and a round trip to each server it
// is written to: 10,000 made these the package's slowest tests.
// (TestPHPSessionInterop keeps 10,000: php-memcached's weighted ring is
// compared with no cheaper lookup.)
const peclSessionCount = 2000

// deleteSessions deletes keys from every server.
func deleteSessions(t *testing.T, servers []*memcachedtest.Server, keys []string) {
	t.Helper()
	for _, s := range servers {
		c := memcache.New(s.Addr)
		for _, k := range keys {
			if err := c.Delete(k); err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
				t.Fatalf("delete %q from %s: %v", k, s.Addr, err)
			}
		}
		c.Close()
	}
}

// sessionConfigs are the server sets of the session tests: the first 3
// and all 5 of the started servers, with unequal weights.
func sessionConfigs(servers []*memcachedtest.Server) []struct {
	name string
	ms   []Member
	srv  []*memcachedtest.Server
} {
	weights := []int{1, 3, 1, 2, 5}
	ms := make([]Member, len(servers))
	for i, s := range servers {
		ms[i] = Member{"127.0.0.1", s.Port, weights[i]}
	}
	return []struct {
		name string
		ms   []Member
		srv  []*memcachedtest.Server
	}{
		{"3 servers 1,3,1", ms[:3], servers[:3]},
		{"5 servers 1,3,1,2,5", ms, servers},
	}
}

// TestPeclSessionInterop writes sessions through pecl/memcache's session
// handler (session.save_handler = memcache) and checks that each landed on
// the member the session distribution names: with
// memcache.session_redundancy=1 on Owner alone, and with the default
// redundancy of 2 on the first two members of Owners, for random ids and
// for ids whose 20 failover candidates all name one member (the ports the
// servers get decide how many there are).
func TestPeclSessionInterop(t *testing.T) {
	php := gatewaytest.PHP(t, "memcache", "session")
	if testing.Short() {
		t.Skip("starts memcached and writes 1,000s of PHP sessions")
	}
	servers := memcachedtest.StartN(t, 5)
	sessionModes := map[Distribution]Distribution{
		PeclStandardCRC32:   PeclSessionStandardCRC32,
		PeclStandardFNV:     PeclSessionStandardFNV,
		PeclConsistentCRC32: PeclSessionConsistentCRC32,
		PeclConsistentFNV:   PeclSessionConsistentFNV,
	}
	for ci, c := range sessionConfigs(servers) {
		var path []string
		for _, m := range c.ms {
			// A timeout of 10 s, not 1: a write that times out on a
			// loaded machine marks its server failed, and the session
			// goes to the next member instead.
			path = append(path, fmt.Sprintf("tcp://%s:%d?weight=%d&timeout=10", m.Host, m.Port, m.Weight))
		}
		for si, s := range peclStrategies() {
			d := sessionModes[s.d]
			r := mustNew(t, d, c.ms)
			opts := append(peclQuiet(),
				"-d", "session.save_handler=memcache", "-d", `session.save_path="`+strings.Join(path, ", ")+`"`,
				"-d", "memcache.hash_strategy="+s.strategy, "-d", "memcache.hash_function="+s.hash,
			)
			seed := uint64(100*ci + 10*si)
			t.Run(c.name+"/"+string(d), func(t *testing.T) {
				t.Parallel()
				checkSessions(t, php, c.srv, sessionIDs(peclSessionCount, seed), "", append(slices.Clip(opts), "-d", "memcache.session_redundancy=1"),
					func(id string) []int { return []int{r.Owner(id)} })
			})
			t.Run(c.name+"/"+string(d)+"/redundancy 2", func(t *testing.T) {
				t.Parallel()
				// Ids whose 20 failover candidates all name one member,
				// too rare to be among 1,000 random ones in most runs:
				// their second copy is on a later candidate's member.
				past := pastCandidates(r, sessionIDs(200000, seed+2), 20)
				t.Logf("%d ids with all 20 candidates on one member added", len(past))
				checkSessions(t, php, c.srv, append(sessionIDs(1000, seed+1), past...), "", opts, func(id string) []int {
					var want []int
					for m := range r.Owners(id) {
						if want = append(want, m); len(want) == 2 {
							break
						}
					}
					return want
				})
			})
		}
	}
}

// memcachedConsistentScript is phpScript's sibling for Consistent: the
// Memcached class with OPT_DISTRIBUTION = DISTRIBUTION_CONSISTENT and
// servers of weight 1.
const memcachedConsistentScript = `<?php
$servers = json_decode($argv[1], true, 512, JSON_THROW_ON_ERROR);
$m = new Memcached();
$m->setOption(Memcached::OPT_DISTRIBUTION, Memcached::DISTRIBUTION_CONSISTENT);
$m->addServers($servers);
while (($line = fgets(STDIN)) !== false) {
    $s = $m->getServerByKey(substr($line, 0, -1));
    echo $s['host'], ':', $s['port'], "\n";
}
`

// TestPHPSessionInterop writes sessions through php-memcached's session
// handler with its defaults (consistent hash, type ketama, prefix
// memc.sess.key.) to servers listed with unequal weights, and checks that
// each landed on Consistent's Owner of the session id; it also compares
// Consistent with the Memcached class's DISTRIBUTION_CONSISTENT.
func TestPHPSessionInterop(t *testing.T) {
	php := gatewaytest.PHP(t, "memcached", "session")
	if testing.Short() {
		t.Skip("starts memcached and writes 10,000s of PHP sessions")
	}
	servers := memcachedtest.StartN(t, 5)
	for ci, c := range sessionConfigs(servers) {
		var path []string
		for _, m := range c.ms {
			path = append(path, fmt.Sprintf("%s:%d:%d", m.Host, m.Port, m.Weight))
		}
		r := mustNew(t, Consistent, c.ms)
		t.Run(c.name+"/session handler", func(t *testing.T) {
			t.Parallel()
			checkSessions(t, php, c.srv, sessionIDs(10000, uint64(1000+ci)), "memc.sess.key.",
				[]string{"-d", "session.save_handler=memcached", "-d", "session.save_path=" + strings.Join(path, ",")},
				func(id string) []int { return []int{r.Owner(id)} })
		})
		t.Run(c.name+"/DISTRIBUTION_CONSISTENT", func(t *testing.T) {
			t.Parallel()
			keys := interopKeys(10000, uint64(2000+ci))
			servers := make([][]any, len(c.ms))
			for i, m := range c.ms {
				servers[i] = []any{m.Host, m.Port, 1}
			}
			cfg, _ := json.Marshal(servers)
			out := runPHPScript(t, php, memcachedConsistentScript, strings.Join(keys, "\n")+"\n", nil, string(cfg))
			want := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			mismatches := 0
			for i, k := range keys {
				if g := memberName(c.ms[r.Owner(k)]); g != want[i] {
					if mismatches++; mismatches <= 5 {
						t.Errorf("Owner(%q) = %s, php-memcached says %s", k, g, want[i])
					}
				}
			}
			t.Logf("%s consistent: %d keys compared with getServerByKey, %d mismatches", c.name, len(keys), mismatches)
		})
	}
}
