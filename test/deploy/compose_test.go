package deploy

import (
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/memcgate/memcgate/test/gatewaytest"
)

type composeService struct {
	Image           string            `yaml:"image"`
	Build           yaml.Node         `yaml:"build"`
	Environment     map[string]string `yaml:"environment"`
	Volumes         []string          `yaml:"volumes"`
	Ports           []string          `yaml:"ports"`
	StopGracePeriod string            `yaml:"stop_grace_period"`
	DependsOn       yaml.Node         `yaml:"depends_on"`
}

var nginxServerRE = regexp.MustCompile(`(?m)^\s*server\s+([^\s;{]+)`)

func TestCompose(t *testing.T) {
	const rel = "deploy/compose/compose.yaml"
	var c struct {
		Services map[string]composeService `yaml:"services"`
	}
	decodeYAML(t, rel, &c) // yaml.v3 resolves the << merge keys

	var memcached, gateways []string
	var lb string
	for _, name := range keys(c.Services) {
		s := c.Services[name]
		switch {
		case strings.HasPrefix(s.Image, "memcached"):
			memcached = append(memcached, name)
		case s.Environment["MEMCGATE_SERVERS"] != "":
			gateways = append(gateways, name)
		case strings.HasPrefix(s.Image, "nginx"):
			lb = name
		}
	}
	if len(memcached) != 3 || len(gateways) != 2 || lb == "" {
		t.Fatalf("services: memcached %v, gateways %v, nginx %q; want 3, 2 and 1", memcached, gateways, lb)
	}

	var listenPorts []string
	for _, name := range gateways {
		s := c.Services[name]
		cfg := loadConfig(t, rel+" "+name, s.Environment)
		var hosts []string
		for _, srv := range cfg.Servers {
			hosts = append(hosts, srv.Host)
			if srv.Port != 11211 {
				t.Errorf("%s: server %s: memcached listens on 11211", name, srv)
			}
		}
		if !slices.Equal(hosts, memcached) {
			t.Errorf("%s: MEMCGATE_SERVERS hosts %v, want the memcached service names %v", name, hosts, memcached)
		}
		if cfg.AdminAddr != ":9090" {
			t.Errorf("%s: MEMCGATE_ADMIN_ADDR %q: the image's healthcheck and the published admin port need :9090", name, cfg.AdminAddr)
		}
		_, port, _ := net.SplitHostPort(cfg.ListenAddr)
		listenPorts = append(listenPorts, port)
		d, err := parseSeconds(s.StopGracePeriod)
		if err != nil {
			t.Errorf("%s: stop_grace_period %q: %v (docker's default 10s cuts the drain)", name, s.StopGracePeriod, err)
		} else {
			graceCovers(t, rel+" "+name, d, cfg)
		}
		var build struct{ Context, Dockerfile string }
		if err := s.Build.Decode(&build); err != nil {
			t.Fatalf("%s: build: %v", name, err)
		}
		if _, err := os.Stat(filepath.Join(root, "deploy/compose", build.Context, build.Dockerfile)); err != nil {
			t.Errorf("%s: build context %s + %s: %v", name, build.Context, build.Dockerfile, err)
		}
	}

	// nginx gets deploy/nginx/memcgate-lb.conf, whose upstream lists the
	// gateway services on their data port.
	var conf string
	for _, v := range c.Services[lb].Volumes {
		src, _, _ := strings.Cut(v, ":")
		if strings.HasSuffix(src, "memcgate-lb.conf") {
			conf = filepath.Join("deploy/compose", src)
		}
	}
	if conf != "deploy/nginx/memcgate-lb.conf" {
		t.Fatalf("nginx does not mount ../nginx/memcgate-lb.conf (volumes %v)", c.Services[lb].Volumes)
	}
	var upstream []string
	for _, m := range nginxServerRE.FindAllStringSubmatch(read(t, conf), -1) {
		upstream = append(upstream, m[1])
	}
	var want []string
	for i, g := range gateways {
		want = append(want, g+":"+listenPorts[i])
	}
	if !slices.Equal(upstream, want) {
		t.Errorf("%s upstream servers %v, want the compose gateways %v", conf, upstream, want)
	}
}

// TestBalancerConfigs checks the shipped nginx and HAProxy files against
// the gateway's timeouts; test/lb runs them for real.
func TestBalancerConfigs(t *testing.T) {
	cfg := loadConfig(t, "defaults", map[string]string{})
	dur := func(t *testing.T, text, re string) time.Duration {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("no match for %s", re)
		}
		d, err := parseSeconds(m[1])
		if err != nil {
			t.Fatalf("%s: %v", m[0], err)
		}
		return d
	}
	t.Run("nginx", func(t *testing.T) {
		conf := read(t, "deploy/nginx/memcgate-lb.conf")
		for _, want := range []string{"proxy_http_version 1.1;", `proxy_set_header Connection "";`, "keepalive 64;",
			"proxy_next_upstream error timeout http_502 http_503;"} {
			if !strings.Contains(conf, want) {
				t.Errorf("memcgate-lb.conf lacks %q", want)
			}
		}
		if regexp.MustCompile(`(?m)^\s*proxy_next_upstream[^;]*non_idempotent`).MatchString(conf) {
			t.Error("proxy_next_upstream must not list non_idempotent: POSTs (incr, append) would be replayed")
		}
		if ka := dur(t, conf, `keepalive_timeout\s+(\S+);`); ka >= cfg.IdleTimeout {
			t.Errorf("upstream keepalive_timeout %s must be below MEMCGATE_IDLE_TIMEOUT %s", ka, cfg.IdleTimeout)
		}
		if rt := dur(t, conf, `proxy_read_timeout\s+(\S+);`); rt <= cfg.RequestTimeout {
			t.Errorf("proxy_read_timeout %s must exceed MEMCGATE_REQUEST_TIMEOUT %s", rt, cfg.RequestTimeout)
		}
	})
	t.Run("haproxy", func(t *testing.T) {
		conf := read(t, "deploy/haproxy/haproxy.cfg")
		for _, want := range []string{"option httpchk GET /readyz", "option redispatch", "retry-on conn-failure empty-response response-timeout 503",
			"http-request disable-l7-retry if !replay_method", "check port 9090"} {
			if !strings.Contains(conf, want) {
				t.Errorf("haproxy.cfg lacks %q", want)
			}
		}
		if ts := dur(t, conf, `timeout server\s+(\S+)`); ts <= cfg.RequestTimeout {
			t.Errorf("timeout server %s must exceed MEMCGATE_REQUEST_TIMEOUT %s", ts, cfg.RequestTimeout)
		}
		// Marking a draining gateway down must take less than the drain:
		// the first failed check comes within inter, the next fall-1 ones
		// every fastinter.
		inter := dur(t, conf, `default-server[^\n]*\binter\s+(\S+)`)
		fast := dur(t, conf, `default-server[^\n]*\bfastinter\s+(\S+)`)
		fall, _ := strconv.Atoi(regexp.MustCompile(`default-server[^\n]*\bfall\s+(\d+)`).FindStringSubmatch(conf)[1])
		if detect := inter + time.Duration(fall-1)*fast; detect >= cfg.DrainDelay {
			t.Errorf("HAProxy needs up to %s to see /readyz fail, longer than MEMCGATE_DRAIN_DELAY %s", detect, cfg.DrainDelay)
		}
		if out, err := run(t, "", gatewaytest.Tool(t, "haproxy", "haproxy"), "-c", "-f", filepath.Join(root, "deploy/haproxy/haproxy.cfg")); err != nil {
			t.Errorf("haproxy -c: %v\n%s", err, out)
		}
	})
}
