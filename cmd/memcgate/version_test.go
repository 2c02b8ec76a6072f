package main

import (
	"bytes"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestReadBuildInfo(t *testing.T) {
	stamped := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261203232322-997c0cd40a7d+dirty"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "997c0cd40a7d"}, {Key: "vcs.modified", Value: "true"}}}
	clean := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "false"}}}
	tests := []struct {
		name             string
		ldVersion, ldRev string
		bi               *debug.BuildInfo
		want             buildInfo
	}{
		{"make build: -X version, VCS revision", "v1.2.0-3-g997c0cd-dirty", "", stamped,
			buildInfo{Version: "v1.2.0-3-g997c0cd-dirty", Revision: "997c0cd40a7d-dirty", GoVersion: "go1.26.8"}},
		{"go build in a repository", "", "", stamped,
			buildInfo{Version: "v0.0.0-20261203232322-997c0cd40a7d+dirty", Revision: "997c0cd40a7d-dirty", GoVersion: "go1.26.8"}},
		{"docker build: both from arguments, no VCS", "v1.2.0", "0123abcd", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			buildInfo{Version: "v1.2.0", Revision: "0123abcd", GoVersion: "go1.26.8"}},
		{"docker build without arguments", "", "", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			buildInfo{Version: "devel", Revision: "unknown", GoVersion: "go1.26.8"}},
		{"no build information", "", "", nil, buildInfo{Version: "devel", Revision: "unknown", GoVersion: runtime.Version()}},
		{"clean tree", "", "", clean, buildInfo{Version: "devel", Revision: "abc", GoVersion: "go1.26.8"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.want.Platform = runtime.GOOS + "/" + runtime.GOARCH
			if got := readBuildInfo(tt.ldVersion, tt.ldRev, tt.bi); got != tt.want {
				t.Errorf("readBuildInfo = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestVersionCommand(t *testing.T) {
	for _, arg := range []string{"-version", "--version", "version"} {
		var out bytes.Buffer
		if err := run(t.Context(), []string{arg}, nil, &out, &out, nil); err != nil {
			t.Fatalf("memcgate %s: %v", arg, err)
		}
		if got, want := out.String(), currentBuild().String()+"\n"; got != want || !strings.HasPrefix(got, "memcgate ") {
			t.Errorf("memcgate %s printed %q, want %q", arg, got, want)
		}
	}
}

func TestBuildInfoMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	registerBuildInfo(reg, buildInfo{Version: "v1.2.0", Revision: "abc", GoVersion: "go1.26.8"})
	want := `# HELP memcgate_build_info Always 1; its labels say which memcgate binary runs (memcgate -version).
# TYPE memcgate_build_info gauge
memcgate_build_info{goversion="go1.26.8",revision="abc",version="v1.2.0"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "memcgate_build_info"); err != nil {
		t.Error(err)
	}
}
