package status

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestHostileStringsInBrowser: markup that an operator's configuration
// carries (a pool's prefixes are keys, and keys may hold '<', '"' and
// '>'), that a refused reload's error quotes, or that a client puts in a
// /memc command, is shown as text by a real browser: the DOM chromium
// builds from the status page and from /memc's error page has no element
// the markup would make, and has the markup as text.
func TestHostileStringsInBrowser(t *testing.T) {
	chrome := chromium(t)
	mcs := memcachedtest.StartN(t, 2)
	conf := filepath.Join(t.TempDir(), "memcgate.env")
	const img, script = `<img/src=x/onerror=document.title='prefix'>`, `<script>document.title='prefix'</script>`
	good := "MEMCGATE_SERVERS=" + mcs[0].Addr + "\n" +
		"MEMCGATE_POOLS=hostile servers=" + mcs[1].Addr + " prefixes=" + img + "," + script + ",\"q\n"
	if err := os.WriteFile(conf, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	g := gatewaytest.New(t, binary, map[string]string{
		"MEMCGATE_CONFIG_FILE":     conf,
		"MEMCGATE_WATCH_INTERVAL":  "100ms",
		"MEMCGATE_HEALTH_INTERVAL": "200ms",
		"MEMCGATE_DRAIN_DELAY":     "0s",
	})
	g.Start(t)

	// A reload refused for a value of markup: its error quotes the value,
	// and the page's reload history shows the error.
	bad := good + "MEMCGATE_TIMEOUT=<img src=x onerror=document.title='reload'>\n"
	tmp := conf + ".tmp"
	if err := os.WriteFile(tmp, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, conf); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(g.Logs(), "configuration reload refused"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the reload was not refused within 10s:\n%s", gatewaytest.Tail(g.Logs(), 2000))
		}
	}

	dir := t.TempDir()
	pages := []struct {
		name, url string
		want      []string // in the page's text, as text
	}{
		{"status page", "http://" + g.AdminAddr + "/status", []string{img, script, `"q`, `onerror=document.title='reload'`}},
		{"/memc error page", "http://" + g.DataAddr + "/memc?cmd=%3Cscript%3Edocument.title='memc'%3C/script%3E%3Cimg%20src=x%20onerror=document.title='memc'%3E&key=k", []string{`unknown command`}},
	}
	for _, p := range pages {
		dom := runChromium(t, chrome, dir, "--dump-dom", p.url)
		if !strings.Contains(dom, "</html>") {
			t.Fatalf("%s: chromium gave no page:\n%s", p.name, dom)
		}
		lower := strings.ToLower(dom)
		for _, tag := range []string{"<img", "<script"} {
			if strings.Contains(lower, tag) {
				t.Errorf("%s: the DOM has an element %s… made from a string it shows:\n%s", p.name, tag, dom)
			}
		}
		if title := domTitle(dom); strings.Contains(title, "prefix") || strings.Contains(title, "reload") || strings.Contains(title, "memc'") {
			t.Errorf("%s: a script ran: the title is %q", p.name, title)
		}
		text := pageText(dom)
		for _, w := range p.want {
			if !strings.Contains(text, w) {
				t.Errorf("%s: the text lacks %q:\n%s", p.name, w, text)
			}
		}
	}
}

// domTitle returns the text of the DOM's <title>.
func domTitle(dom string) string {
	_, after, ok := strings.Cut(dom, "<title>")
	if !ok {
		return ""
	}
	title, _, _ := strings.Cut(after, "</title>")
	return title
}
