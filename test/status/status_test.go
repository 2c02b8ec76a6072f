// Package status tests the admin listener's status page as an operator
// sees it: the built memcgate binary in front of three real memcached
// processes, one of them killed, and the page loaded in a real headless
// browser (Debian's chromium). Without chromium the test is skipped,
// unless CI or MEMCGATE_TEST_REQUIRE_MEMCACHED is set (make test installs
// it through test/scripts/deps.sh): then it fails.
package status

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"image/png"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

var binary string

// The binary is built as the Dockerfile builds it: this test is about
// what the page shows, and the race detector would only slow the browser's
// machine down (the gateway package's own tests run under -race).
func TestMain(m *testing.M) { gatewaytest.Main(m, false, &binary) }

// screenshotEnv names a file the screenshot is copied to, to refresh
// docs/status-page.png:
// MEMCGATE_TEST_STATUS_SCREENSHOT=$PWD/docs/status-page.png.
const screenshotEnv = "MEMCGATE_TEST_STATUS_SCREENSHOT"

func TestStatusPageInBrowser(t *testing.T) {
	chrome := chromium(t)
	mcs := memcachedtest.StartN(t, 3)
	addrs := make([]string, len(mcs))
	for i, m := range mcs {
		addrs[i] = m.Addr
	}
	g := gatewaytest.New(t, binary, map[string]string{
		"MEMCGATE_SERVERS":         strings.Join(addrs, ","),
		"MEMCGATE_HEALTH_INTERVAL": "200ms",
		"MEMCGATE_DRAIN_DELAY":     "0s",
	})
	g.Start(t)
	admin := "http://" + g.AdminAddr

	// Traffic while the page is looked at, so that it has rates to show.
	loadCtx, stopLoad := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { load(loadCtx, "http://"+g.DataAddr) })
	defer wg.Wait()
	defer stopLoad()
	waitServed(t, g, 300)

	victim := mcs[1]
	victim.Kill()
	reason := waitDown(t, admin, victim.Addr)
	t.Logf("%s is down: %s", victim.Addr, reason)

	dir := t.TempDir()
	dom := runChromium(t, chrome, dir, "--dump-dom", admin+"/status")
	rows := nodeRows(dom)
	if len(rows) != len(mcs) {
		t.Fatalf("the page shows %d node rows, want %d:\n%s", len(rows), len(mcs), dom)
	}
	shareSum, shownSum := 0.0, 0.0
	for i, m := range mcs {
		r := rows[i]
		if r.node != m.Addr {
			t.Errorf("row %d is node %q, want %q", i, r.node, m.Addr)
		}
		want, wantBadge := "up", "UP"
		if m == victim {
			want, wantBadge = "down", "DOWN"
		}
		if r.state != want || !strings.Contains(r.text, " "+wantBadge+" ") {
			t.Errorf("node %s shows state %q (%q), want %q (%s)", r.node, r.state, r.text, want, wantBadge)
		}
		if m == victim && !strings.Contains(r.text, reason) {
			t.Errorf("node %s row %q lacks the reason /debug/nodes gives, %q", r.node, r.text, reason)
		}
		if m != victim && r.ops <= 0 {
			t.Errorf("node %s shows %v ops/s under load, want more than 0", r.node, r.ops)
		}
		shareSum += r.share
		shownSum += r.shownShare
	}
	if shareSum < 0.999 || shareSum > 1.001 {
		t.Errorf("node shares sum to %v, want 1", shareSum)
	}
	if shownSum < 99.7 || shownSum > 100.3 {
		t.Errorf("the shares shown sum to %.1f %%, want 100 %% (± rounding)", shownSum)
	}
	if text := pageText(dom); !strings.Contains(text, "Nodes up 2 / 3 1 down") || !strings.Contains(text, "no reloads") {
		t.Errorf("page text lacks the node summary (2 / 3, 1 down) or the reload history:\n%s", text)
	}

	// Give the second view a window of traffic after the kill.
	waitServed(t, g, served(t, g)+400)
	shot := filepath.Join(dir, "status.png")
	runChromium(t, chrome, dir, "--screenshot="+shot, "--window-size=1280,900", "--hide-scrollbars", admin+"/status")
	checkScreenshot(t, shot)
	if dst := os.Getenv(screenshotEnv); dst != "" {
		b, err := os.ReadFile(shot)
		if err == nil {
			err = os.WriteFile(dst, b, 0o644)
		}
		if err != nil {
			t.Fatalf("copying the screenshot to %s: %v", dst, err)
		}
		t.Logf("screenshot written to %s (%d bytes)", dst, len(b))
	}
}

// chromium returns the path of Debian's chromium, or skips t (fails it
// where tests must not skip).
func chromium(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("chromium")
	if err == nil {
		return p
	}
	if os.Getenv("CI") != "" || os.Getenv("MEMCGATE_TEST_REQUIRE_MEMCACHED") != "" {
		t.Fatalf("chromium is required (apt-get install chromium; make test installs it): %v", err)
	}
	t.Skipf("chromium is not installed (apt-get install chromium): %v", err)
	return ""
}

// runChromium runs headless chromium on one URL (the last of args) with
// its profile, home and caches under dir, and returns what it printed on
// stdout. It kills chromium's whole process group if it takes longer than
// 30 s.
func runChromium(t *testing.T, bin, dir string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	base := []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--force-device-scale-factor=1", "--user-data-dir=" + filepath.Join(dir, "profile"),
	}
	cmd := exec.CommandContext(ctx, bin, append(base, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_CONFIG_HOME="+dir, "XDG_CACHE_HOME="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\nstderr:\n%s", args, err, stderr.String())
	}
	t.Logf("chromium %s took %v", args[0], time.Since(start).Round(time.Millisecond))
	return stdout.String()
}

// nodeRow is one memcached node as the page shows it.
type nodeRow struct {
	node, state       string
	share, shownShare float64 // data-share (a fraction) and the visible percentage
	ops               float64 // data-ops
	text              string  // the row's visible text, spaces collapsed
}

var (
	rowRE   = regexp.MustCompile(`(?s)<tr class="node [^"]*" data-node="([^"]*)" data-state="([^"]*)" data-share="([^"]*)" data-ops="([^"]*)">(.*?)</tr>`)
	shareRE = regexp.MustCompile(`(?s)<td class="share">([0-9.]+) %`)
	tagRE   = regexp.MustCompile(`<[^>]*>`)
	spaceRE = regexp.MustCompile(`\s+`)
)

// nodeRows reads the node table out of the DOM chromium dumped.
func nodeRows(dom string) []nodeRow {
	var out []nodeRow
	for _, m := range rowRE.FindAllStringSubmatch(dom, -1) {
		r := nodeRow{node: html.UnescapeString(m[1]), state: m[2], text: " " + pageText(m[5]) + " "}
		r.share, _ = strconv.ParseFloat(m[3], 64)
		r.ops, _ = strconv.ParseFloat(m[4], 64)
		if s := shareRE.FindStringSubmatch(m[5]); s != nil {
			r.shownShare, _ = strconv.ParseFloat(s[1], 64)
		}
		out = append(out, r)
	}
	return out
}

// pageText is the visible text of an HTML fragment, spaces collapsed.
func pageText(fragment string) string {
	if i := strings.Index(fragment, "<body"); i >= 0 {
		fragment = fragment[i:]
	}
	return strings.TrimSpace(spaceRE.ReplaceAllString(html.UnescapeString(tagRE.ReplaceAllString(fragment, " ")), " "))
}

// checkScreenshot checks that the PNG is 1280×900 and that the page's
// inline style applied under its Content-Security-Policy: the header bar
// is dark, not the white of an unstyled page.
func checkScreenshot(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot %s: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() != 1280 || b.Dy() != 900 {
		t.Errorf("screenshot is %dx%d, want 1280x900", b.Dx(), b.Dy())
	}
	r, g, b, _ := img.At(640, 5).RGBA()
	if r>>8 > 0x40 || g>>8 > 0x40 || b>>8 > 0x50 {
		t.Errorf("header pixel is #%02x%02x%02x, want the dark header (#24292f): was the style applied?", r>>8, g>>8, b>>8)
	}
}

// load sends PUTs and GETs over a spread of keys until ctx is done, about
// 400 requests a second at most, and for a minute at most.
func load(ctx context.Context, base string) {
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(time.Minute)
	for i := 0; time.Now().Before(deadline); i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		send(ctx, client, http.MethodPut, fmt.Sprintf("%s/status-key-%d", base, i%300), "v"+strconv.Itoa(i))
		send(ctx, client, http.MethodGet, fmt.Sprintf("%s/status-key-%d", base, (i*7)%400), "")
	}
}

func send(ctx context.Context, client *http.Client, method, url, body string) {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return
	}
	resp, err := client.Do(req)
	if err != nil {
		return // a failed request is the page's business, not the load's
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// served returns the requests the gateway answered so far.
func served(t *testing.T, g *gatewaytest.Gateway) float64 {
	t.Helper()
	n, err := g.Served(t.Context())
	if err != nil {
		t.Fatalf("reading the gateway's metrics: %v", err)
	}
	return n
}

// waitServed waits up to 15 s until the gateway answered n requests.
func waitServed(t *testing.T, g *gatewaytest.Gateway, n float64) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		got := served(t, g)
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway answered %v requests in 15 s, want %v", got, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitDown waits up to 10 s until /debug/nodes says node is down, and
// returns the reason it gives.
func waitDown(t *testing.T, admin, node string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		body, err := gatewaytest.Scrape(t.Context(), admin+"/debug/nodes")
		if err != nil {
			t.Fatalf("/debug/nodes: %v", err)
		}
		var nodes []struct {
			Node   string `json:"node"`
			Up     bool   `json:"up"`
			Reason string `json:"reason"`
		}
		if err := json.Unmarshal([]byte(body), &nodes); err != nil {
			t.Fatalf("/debug/nodes: %v\n%s", err, body)
		}
		for _, n := range nodes {
			if n.Node == node && !n.Up {
				return n.Reason
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not marked down 10 s after it was killed:\n%s", node, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
