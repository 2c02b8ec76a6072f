package liveconfig

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/config"
)

// TestReloadReferenceMatchesLiveVars keeps docs/configuration.md's list
// of what a reload applies ("A good one takes effect at once … for:",
// one bullet per group, each naming its variables before its first
// colon) the same set as liveVars, so that a variable made live, or no
// longer live, cannot leave the page promising otherwise. CONFIG_FILE is
// in liveVars (a reload reads it again) but the page says it comes from
// the environment only. The bullet on "the content of the TLS files"
// names the files a reload loads again (tlsFiles), whose paths need a
// restart: it is checked against those instead.
func TestReloadReferenceMatchesLiveVars(t *testing.T) {
	const ref = "../../../../docs/configuration.md"
	b, err := os.ReadFile(ref)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "\nA good one takes effect at once")
	if start < 0 {
		t.Fatalf("%s: no paragraph starting %q", ref, "A good one takes effect at once")
	}
	text = text[start:]
	end := strings.Index(text, "\nEvery other setting")
	if end < 0 {
		t.Fatalf("%s: no paragraph starting %q after the list of live settings", ref, "Every other setting")
	}
	text = text[:end]

	known := map[string]bool{}
	for _, v := range config.Vars() {
		known[strings.TrimPrefix(v.Name, config.Prefix)] = true
	}
	name := regexp.MustCompile("`(?:" + config.Prefix + ")?([A-Z][A-Z0-9_]*)`")
	var documented, files []string
	for _, bullet := range strings.Split(text, "\n- ")[1:] {
		lead, _, _ := strings.Cut(bullet, ":")
		into := &documented
		if strings.HasPrefix(lead, "the content of the TLS files") {
			into = &files
		}
		n := 0
		for _, m := range name.FindAllStringSubmatch(lead, -1) {
			if known[m[1]] {
				*into = append(*into, m[1])
				n++
			}
		}
		if n == 0 {
			t.Errorf("%s: the bullet %q names no variable before its first colon", ref, strings.SplitN(bullet, "\n", 2)[0])
		}
	}

	want := slices.DeleteFunc(slices.Clone(liveVars), func(v string) bool { return v == "CONFIG_FILE" })
	slices.Sort(want)
	slices.Sort(documented)
	for _, v := range want {
		if !slices.Contains(documented, v) {
			t.Errorf("%s: a reload applies %s%s, but the list of what a reload applies does not name it", ref, config.Prefix, v)
		}
	}
	for i, v := range documented {
		if !slices.Contains(want, v) {
			t.Errorf("%s: the list of what a reload applies names %s%s, which needs a restart (liveVars)", ref, config.Prefix, v)
		}
		if i > 0 && documented[i-1] == v {
			t.Errorf("%s: the list of what a reload applies names %s%s twice", ref, config.Prefix, v)
		}
	}

	all := config.Config{TLSCertFile: "c", TLSKeyFile: "k", AdminTLSCertFile: "c", AdminTLSKeyFile: "k",
		UpstreamTLS: true, UpstreamTLSCAFile: "ca", UpstreamTLSCert: "c", UpstreamTLSKey: "k"}
	var reloaded []string
	for _, f := range tlsFiles(all) {
		reloaded = append(reloaded, strings.TrimPrefix(f.name, config.Prefix))
	}
	slices.Sort(reloaded)
	slices.Sort(files)
	if !slices.Equal(files, reloaded) {
		t.Errorf("%s: the TLS files a reload loads again are %v; the list names %v", ref, reloaded, files)
	}
}
