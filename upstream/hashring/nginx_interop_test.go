package hashring

import (
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
)

// TestNginxInterop compares the Nginx distribution with nginx's own
// `hash $http_x_key consistent`: a real nginx proxies each key to one of
// several local backends that answer with their address. A second upstream
// marks member 1 `down`, which checks that nginx's failover walk is the one
// Owners yields. A third, `hash $http_x_key` without consistent, is
// compared with PeclStandardCRC32, which docs/migrating-from-nginx-memc.md
// names for it: the same owner for every key except those whose
// (crc32 >> 16) & 0x7fff is 0, which nginx leaves in bucket 0 and
// pecl/memcache moves to bucket 1. make test installs nginx; a missing
// nginx skips the test, or fails it under CI or
// MEMCGATE_TEST_REQUIRE_MEMCACHED (gatewaytest.Tool).
func TestNginxInterop(t *testing.T) {
	nginx := gatewaytest.Tool(t, "nginx", "nginx")
	if testing.Short() {
		t.Skip("starts nginx")
	}
	dir := t.TempDir()

	// Five backends on distinct loopback addresses and free ports.
	backends := make([]Member, 5)
	for i := range backends {
		host := fmt.Sprintf("127.0.0.%d", i+1)
		backends[i] = Member{Host: host, Port: freePort(t, host)}
	}
	configs := []struct {
		name    string
		weights []int
	}{
		{"a", []int{1, 2, 1}},
		{"b", []int{1, 3, 1, 2, 5}},
	}
	const down = 1 // member marked down in the "-down" upstreams

	var conf strings.Builder
	fmt.Fprintf(&conf, "daemon off;\nmaster_process off;\npid %s/nginx.pid;\nerror_log %s/error.log warn;\n", dir, dir)
	conf.WriteString("events { worker_connections 64; }\nhttp {\n  access_log off;\n")
	for _, p := range []string{"client_body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		fmt.Fprintf(&conf, "  %s_temp_path %s/%s;\n", p, dir, p)
	}
	for _, c := range configs {
		for _, suffix := range []string{"", "-down"} {
			fmt.Fprintf(&conf, "  upstream %s%s {\n    hash $http_x_key consistent;\n", c.name, suffix)
			for i, w := range c.weights {
				b := backends[i]
				fmt.Fprintf(&conf, "    server %s:%d weight=%d", b.Host, b.Port, w)
				if suffix != "" && i == down {
					conf.WriteString(" down")
				}
				conf.WriteString(";\n")
			}
			conf.WriteString("  }\n")
		}
	}
	plain := configs[1].weights
	conf.WriteString("  upstream plain {\n    hash $http_x_key;\n")
	for i, w := range plain {
		fmt.Fprintf(&conf, "    server %s:%d weight=%d;\n", backends[i].Host, backends[i].Port, w)
	}
	conf.WriteString("  }\n")
	front := freePort(t, "127.0.0.1")
	fmt.Fprintf(&conf, "  server {\n    listen 127.0.0.1:%d;\n", front)
	for _, c := range configs {
		for _, suffix := range []string{"", "-down"} {
			fmt.Fprintf(&conf, "    location = /%s%s { proxy_pass http://%s%s; proxy_next_upstream off; }\n", c.name, suffix, c.name, suffix)
		}
	}
	conf.WriteString("    location = /plain { proxy_pass http://plain; proxy_next_upstream off; }\n  }\n")
	for _, b := range backends {
		fmt.Fprintf(&conf, "  server { listen %s:%d; location / { return 200 \"$server_addr:$server_port\"; } }\n", b.Host, b.Port)
	}
	conf.WriteString("}\n")
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf.String()), 0o600); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(nginx, "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", confPath)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start nginx: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})

	client := &http.Client{Timeout: 5 * time.Second}
	base := fmt.Sprintf("http://127.0.0.1:%d/", front)
	ask := func(path, key string) (string, error) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+path, nil)
		if err != nil {
			return "", err
		}
		req.Header.Set("X-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return "", err
		}
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("%s: %s", resp.Status, body)
		}
		return string(body), nil
	}
	// Poll until nginx answers (no sleeping for synchronisation).
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := ask(configs[0].name, "probe"); err == nil {
			break
		} else if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("nginx did not come up: %v\n%s", err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}

	const n = 10000
	keys := interopKeys(n, 20260502)
	for _, c := range configs {
		ms := slices.Clone(backends[:len(c.weights)])
		for i, w := range c.weights {
			ms[i].Weight = w
		}
		r := mustNew(t, Nginx, ms)
		for _, suffix := range []string{"", "-down"} {
			t.Run(c.name+suffix, func(t *testing.T) {
				t.Parallel()
				mismatches := 0
				for _, k := range keys {
					want := r.Owner(k)
					if suffix != "" {
						for i := range r.Owners(k) {
							if i != down {
								want = i
								break
							}
						}
					}
					got, err := ask(c.name+suffix, k)
					if err != nil {
						t.Fatalf("nginx, key %q: %v", k, err)
					}
					if w := ms[want].Host + ":" + strconv.Itoa(ms[want].Port); got != w {
						if mismatches++; mismatches <= 5 {
							t.Errorf("Owner(%q) = %s, nginx chose %s", k, w, got)
						}
					}
				}
				t.Logf("weights %v%s: %d keys compared with nginx, %d mismatches", c.weights, suffix, len(keys), mismatches)
			})
		}
	}
	t.Run("plain", func(t *testing.T) {
		t.Parallel()
		ms := slices.Clone(backends[:len(plain)])
		for i, w := range plain {
			ms[i].Weight = w
		}
		r := mustNew(t, PeclStandardCRC32, ms)
		// k25's (crc32 >> 16) & 0x7fff is 0: the one kind of key whose
		// owner differs, named in the migration guide.
		zeroes := 0
		for _, k := range append(slices.Clone(keys), "k25") {
			want := r.Owner(k)
			if (crc32.ChecksumIEEE([]byte(k))>>16)&0x7fff == 0 {
				zeroes++
				want = 0 // bucket 0: the first member, whatever the weights
			}
			got, err := ask("plain", k)
			if err != nil {
				t.Fatalf("nginx, key %q: %v", k, err)
			}
			if w := ms[want].Host + ":" + strconv.Itoa(ms[want].Port); got != w {
				t.Errorf("key %q: want nginx to choose %s, it chose %s", k, w, got)
			}
		}
		if zeroes == 0 {
			t.Error("no key with a zero hash was compared")
		}
		t.Logf("weights %v: %d keys compared with nginx's hash without consistent, %d of them with a zero hash", plain, len(keys)+1, zeroes)
	})
}

// freePort returns a TCP port that was free on host a moment ago.
func freePort(t *testing.T, host string) int {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Skipf("cannot listen on %s: %v", host, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
