package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// version and revision are set at build time, and only then:
//
//	go build -ldflags "-X main.version=$(git describe --tags --always --dirty) -X main.revision=$(git rev-parse HEAD)"
//
// (make build sets version; the Dockerfile takes both as build arguments,
// VERSION and REVISION, because its context has no .git). When empty, the
// module version and VCS revision Go stamps into binaries built in a
// repository are used. They are the only package variables of the
// command, because -X can set nothing else; nothing writes them.
var version, revision string

// buildInfo says which binary this is: for -version, memcgate_build_info
// and /debug/config.
type buildInfo struct {
	Version   string `json:"version"`   // release (git describe), else the module version, else "devel"
	Revision  string `json:"revision"`  // VCS commit, "-dirty" added for uncommitted changes; "unknown" if not stamped
	GoVersion string `json:"goversion"` // the toolchain that built it
	Platform  string `json:"platform"`  // GOOS/GOARCH
}

// readBuildInfo combines the -X values (ldVersion, ldRevision; empty if
// not set) with what Go recorded in the binary (bi, nil if nothing).
func readBuildInfo(ldVersion, ldRevision string, bi *debug.BuildInfo) buildInfo {
	b := buildInfo{Version: ldVersion, Revision: ldRevision, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi != nil {
		b.GoVersion = bi.GoVersion
		if b.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			b.Version = bi.Main.Version
		}
		var rev string
		var modified bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if b.Revision == "" && rev != "" {
			b.Revision = rev
			if modified {
				b.Revision += "-dirty"
			}
		}
	}
	if b.Version == "" {
		b.Version = "devel"
	}
	if b.Revision == "" {
		b.Revision = "unknown"
	}
	return b
}

// currentBuild is readBuildInfo for this binary.
func currentBuild() buildInfo {
	bi, _ := debug.ReadBuildInfo()
	return readBuildInfo(version, revision, bi)
}

// String is the line -version prints.
func (b buildInfo) String() string {
	return fmt.Sprintf("memcgate %s (revision %s, %s, %s)", b.Version, b.Revision, b.GoVersion, b.Platform)
}

// registerBuildInfo registers memcgate_build_info{version,revision,goversion},
// always 1: for joining the version onto other series, and for spotting
// mixed versions during a rollout.
func registerBuildInfo(reg prometheus.Registerer, b buildInfo) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "memcgate_build_info",
		Help:        "Always 1; its labels say which memcgate binary runs (memcgate -version).",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion},
	}, func() float64 { return 1 }))
}
