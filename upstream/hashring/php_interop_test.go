package hashring

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/test/gatewaytest"
)

// phpScript prints, for each key on stdin (one per line), the server that
// php-memcached's Memcached::getServerByKey picks, as "host:port". argv[1] is
// a JSON object {"mode": "ketama"|"modula", "servers": [[host, port, weight]…]}.
const phpScript = `<?php
$cfg = json_decode($argv[1], true, 512, JSON_THROW_ON_ERROR);
$m = new Memcached();
if ($cfg['mode'] === 'ketama') {
    if (!$m->setOption(Memcached::OPT_LIBKETAMA_COMPATIBLE, true)) {
        fwrite(STDERR, "setOption failed\n");
        exit(2);
    }
}
if (!$m->addServers($cfg['servers'])) {
    fwrite(STDERR, "addServers failed\n");
    exit(2);
}
while (($line = fgets(STDIN)) !== false) {
    $k = substr($line, 0, -1);
    $s = $m->getServerByKey($k);
    echo $s === false ? 'FALSE ' . $m->getResultCode() : $s['host'] . ':' . $s['port'], "\n";
}
`

// interopKeys returns n random memcached keys: 1 to 250 bytes (every tenth
// exactly 96), printable non-space ASCII with some multi-byte UTF-8.
func interopKeys(n int, seed uint64) []string {
	rng := rand.New(rand.NewPCG(seed, 0x68617368))
	utf8 := []string{"é", "ü", "ß", "€", "日本", "ключ", "😀", "\u00a0"}
	keys := make([]string, n)
	for i := range keys {
		size := 1 + rng.IntN(250)
		if i%10 == 0 {
			size = 96
		}
		var b strings.Builder
		for b.Len() < size {
			if rng.IntN(12) == 0 {
				if u := utf8[rng.IntN(len(utf8))]; b.Len()+len(u) <= size {
					b.WriteString(u)
				}
				continue
			}
			b.WriteByte(byte('!' + rng.IntN('~'-'!'+1)))
		}
		keys[i] = b.String()
	}
	return keys
}

// phpOwners asks php-memcached for the owner of every key.
func phpOwners(t *testing.T, php, script, mode string, ms []Member, keys []string) []string {
	t.Helper()
	servers := make([][]any, len(ms))
	for i, m := range ms {
		servers[i] = []any{m.Host, m.Port, m.Weight}
	}
	cfg, err := json.Marshal(map[string]any{"mode": mode, "servers": servers})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), php, script, string(cfg))
	cmd.Stdin = strings.NewReader(strings.Join(keys, "\n") + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("php %s: %v\n%s", mode, err, stderr.String())
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != len(keys) {
		t.Fatalf("php %s printed %d lines for %d keys; stderr:\n%s", mode, len(lines), len(keys), stderr.String())
	}
	return lines
}

// TestPHPInterop compares Owner with php-memcached's getServerByKey for
// random keys: Ketama against OPT_LIBKETAMA_COMPATIBLE and Modula against
// the defaults.
func TestPHPInterop(t *testing.T) {
	php := gatewaytest.PHP(t, "memcached")
	script := filepath.Join(t.TempDir(), "owners.php")
	if err := os.WriteFile(script, []byte(phpScript), 0o600); err != nil {
		t.Fatal(err)
	}
	equal25 := make([]Member, 25)
	for i := range equal25 {
		equal25[i] = Member{fmt.Sprintf("mc%02d.example", i), 11211 + i%2, 1}
	}
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
		// 25 equal weights: libmemcached's float32 arithmetic gives 156
		// points per server, not 160.
		{"25 servers equal", equal25},
	}
	const n = 10000
	keys := interopKeys(n, 20260501)
	for _, c := range configs {
		for _, mode := range []Distribution{Ketama, Modula} {
			t.Run(c.name+"/"+string(mode), func(t *testing.T) {
				r := mustNew(t, mode, c.ms)
				want := phpOwners(t, php, script, string(mode), c.ms, keys)
				mismatches := 0
				for i, k := range keys {
					m := c.ms[r.Owner(k)]
					if got := m.Host + ":" + strconv.Itoa(m.Port); got != want[i] {
						if mismatches++; mismatches <= 5 {
							t.Errorf("Owner(%q) = %s, php-memcached says %s", k, got, want[i])
						}
					}
				}
				t.Logf("%s %s: %d keys compared with php-memcached, %d mismatches", c.name, mode, len(keys), mismatches)
			})
		}
	}
}
