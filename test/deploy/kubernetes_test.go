package deploy

import (
	"fmt"
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

const k8sDir = "deploy/kubernetes"

type meta struct {
	Name        string            `yaml:"name"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type object struct {
	APIVersion string    `yaml:"apiVersion"`
	Kind       string    `yaml:"kind"`
	Metadata   meta      `yaml:"metadata"`
	Spec       yaml.Node `yaml:"spec"`
	Data       map[string]string
	file       string
}

type selector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
	TCPSocket *struct {
		Port string `yaml:"port"`
	} `yaml:"tcpSocket"`
}

type container struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Args    []string `yaml:"args"`
	EnvFrom []struct {
		ConfigMapRef *struct {
			Name string `yaml:"name"`
		} `yaml:"configMapRef"`
	} `yaml:"envFrom"`
	Env []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext *struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
}

func (c container) port(name string) int {
	for _, p := range c.Ports {
		if p.Name == name || strconv.Itoa(p.ContainerPort) == name {
			return p.ContainerPort
		}
	}
	return 0
}

type podTemplate struct {
	Metadata meta `yaml:"metadata"`
	Spec     struct {
		TerminationGracePeriodSeconds *int  `yaml:"terminationGracePeriodSeconds"`
		AutomountServiceAccountToken  *bool `yaml:"automountServiceAccountToken"`
		SecurityContext               *struct {
			RunAsNonRoot *bool `yaml:"runAsNonRoot"`
			RunAsUser    *int  `yaml:"runAsUser"`
		} `yaml:"securityContext"`
		Containers []container `yaml:"containers"`
	} `yaml:"spec"`
}

type workloadSpec struct {
	Replicas    *int        `yaml:"replicas"`
	ServiceName string      `yaml:"serviceName"`
	Selector    selector    `yaml:"selector"`
	Template    podTemplate `yaml:"template"`
}

type servicePort struct {
	Name       string `yaml:"name"`
	Port       int    `yaml:"port"`
	TargetPort string `yaml:"targetPort"`
}

type serviceSpec struct {
	ClusterIP string            `yaml:"clusterIP"`
	Selector  map[string]string `yaml:"selector"`
	Ports     []servicePort     `yaml:"ports"`
}

type kustomization struct {
	Resources          []string             `yaml:"resources"`
	Components         []string             `yaml:"components"`
	ConfigMapGenerator []configMapGenerator `yaml:"configMapGenerator"`
	Images             []struct {
		Name    string `yaml:"name"`
		NewName string `yaml:"newName"`
		NewTag  string `yaml:"newTag"`
		Digest  string `yaml:"digest"`
	} `yaml:"images"`
}

type configMapGenerator struct {
	Name     string   `yaml:"name"`
	Envs     []string `yaml:"envs"`
	Literals []string `yaml:"literals"`
}

// loadKustomize reads the objects of the kustomization in dir (and of the
// components found next to it, commented out or not), the ConfigMaps of
// its configMapGenerator included (named as written, without the hash
// kustomize adds; file is their env file).
func loadKustomize(t *testing.T, dir string) []object {
	t.Helper()
	var k kustomization
	decodeYAML(t, filepath.Join(dir, "kustomization.yaml"), &k)
	if len(k.Resources) == 0 {
		t.Fatalf("%s/kustomization.yaml lists no resources", dir)
	}
	var objs []object
	for _, g := range k.ConfigMapGenerator {
		o := object{APIVersion: "v1", Kind: "ConfigMap", Metadata: meta{Name: g.Name}, Data: map[string]string{}}
		for _, e := range g.Envs {
			o.file = filepath.Join(dir, e)
			for name, v := range envFile(t, o.file) {
				o.Data[name] = v
			}
		}
		for _, l := range g.Literals {
			name, v, _ := strings.Cut(l, "=")
			o.Data[name] = v
		}
		objs = append(objs, o)
	}
	for _, r := range k.Resources {
		rel := filepath.Join(dir, r)
		if st, err := os.Stat(filepath.Join(root, rel)); err != nil || st.IsDir() {
			t.Fatalf("kustomization resource %s: not a file (%v)", r, err)
		}
		docs, err := yamlDocs(read(t, rel))
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		for _, d := range docs {
			var o object
			if err := d.Decode(&o); err != nil {
				t.Fatalf("%s: %v", rel, err)
			}
			if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
				t.Errorf("%s: a document without apiVersion, kind or metadata.name", rel)
			}
			o.file = rel
			objs = append(objs, o)
		}
	}
	return objs
}

func secondsDur(n int) time.Duration { return time.Duration(n) * time.Second }

func find(t *testing.T, objs []object, kind, name string) object {
	t.Helper()
	for _, o := range objs {
		if o.Kind == kind && (name == "" || o.Metadata.Name == name) {
			return o
		}
	}
	t.Fatalf("no %s %q in %s", kind, name, k8sDir)
	return object{}
}

func spec[T any](t *testing.T, o object) T {
	t.Helper()
	var v T
	if err := o.Spec.Decode(&v); err != nil {
		t.Fatalf("%s %s (%s): %v", o.Kind, o.Metadata.Name, o.file, err)
	}
	return v
}

// selects reports whether every selector label is on the pod.
func selects(sel, pod map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if pod[k] != v {
			return false
		}
	}
	return true
}

func TestKubernetes(t *testing.T) {
	objs := loadKustomize(t, k8sDir)
	cm := find(t, objs, "ConfigMap", "memcgate")
	cfg := loadConfig(t, cm.file, cm.Data)
	var k kustomization
	decodeYAML(t, filepath.Join(k8sDir, "kustomization.yaml"), &k)

	dep := find(t, objs, "Deployment", "memcgate")
	ds := spec[workloadSpec](t, dep)
	pod := ds.Template
	if !selects(ds.Selector.MatchLabels, pod.Metadata.Labels) {
		t.Errorf("Deployment selector %v does not match its pod labels %v", ds.Selector.MatchLabels, pod.Metadata.Labels)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("Deployment has %d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]

	t.Run("configuration", func(t *testing.T) {
		if len(c.EnvFrom) != 1 || c.EnvFrom[0].ConfigMapRef == nil || c.EnvFrom[0].ConfigMapRef.Name != cm.Metadata.Name {
			t.Errorf("container envFrom does not reference ConfigMap %s", cm.Metadata.Name)
		}
		// From configMapGenerator, so that its name carries a hash of its
		// contents and a change rolls the pods; a plain ConfigMap changes
		// under running pods, which read their environment once.
		generated := slices.ContainsFunc(k.ConfigMapGenerator, func(g configMapGenerator) bool { return g.Name == cm.Metadata.Name })
		if !generated || strings.HasSuffix(cm.file, ".yaml") {
			t.Errorf("ConfigMap %s (%s) is not made by kustomization.yaml's configMapGenerator: editing it would not restart the pods", cm.Metadata.Name, cm.file)
		}
		for _, e := range c.Env {
			if strings.HasPrefix(e.Name, "MEMCGATE_") {
				t.Errorf("container env sets %s; keep MEMCGATE_ variables in the ConfigMap", e.Name)
			}
			if e.Name == "GOMEMLIMIT" {
				soft, err1 := memBytes(e.Value, "MiB")
				hard, err2 := memBytes(c.Resources.Limits["memory"], "Mi")
				if err1 != nil || err2 != nil || soft >= hard || soft < hard*8/10 {
					t.Errorf("GOMEMLIMIT %q against limits.memory %q (%v, %v): want 80-99%% of the limit",
						e.Value, c.Resources.Limits["memory"], err1, err2)
				}
			}
		}
	})

	t.Run("probes", func(t *testing.T) {
		adminPort := c.port("admin")
		if want := ":" + strconv.Itoa(adminPort); cfg.AdminAddr != want || adminPort != 9090 {
			t.Errorf("MEMCGATE_ADMIN_ADDR %q and container port admin %d: want :9090 on both (not loopback: the kubelet probes the pod IP)", cfg.AdminAddr, adminPort)
		}
		if want := ":" + strconv.Itoa(c.port("http")); cfg.ListenAddr != want {
			t.Errorf("MEMCGATE_LISTEN_ADDR %q does not match container port http (%s)", cfg.ListenAddr, want)
		}
		for _, p := range []struct {
			name string
			pr   *probe
			path string
		}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}} {
			if p.pr == nil || p.pr.HTTPGet == nil {
				t.Errorf("%s probe is not an httpGet", p.name)
				continue
			}
			if p.pr.HTTPGet.Path != p.path || c.port(p.pr.HTTPGet.Port) != adminPort {
				t.Errorf("%s probe GETs %s on port %s, want %s on the admin port", p.name, p.pr.HTTPGet.Path, p.pr.HTTPGet.Port, p.path)
			}
		}
	})

	t.Run("termination grace", func(t *testing.T) {
		if pod.Spec.TerminationGracePeriodSeconds == nil {
			t.Fatal("no terminationGracePeriodSeconds (Kubernetes' default 30s)")
		}
		graceCovers(t, dep.file, secondsDur(*pod.Spec.TerminationGracePeriodSeconds), cfg)
	})

	t.Run("security", func(t *testing.T) {
		psc := pod.Spec.SecurityContext
		if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
			t.Error("pod securityContext must set runAsNonRoot: true and a non-zero runAsUser")
		}
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Error("container securityContext must set readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities.drop [ALL]")
		}
		if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
			t.Error("the gateway needs no API access: set automountServiceAccountToken: false")
		}
	})

	t.Run("resources", func(t *testing.T) {
		for _, r := range []string{"cpu", "memory"} {
			if c.Resources.Requests[r] == "" {
				t.Errorf("no %s request", r)
			}
		}
		if c.Resources.Limits["memory"] == "" {
			t.Error("no memory limit")
		}
	})

	t.Run("service, pdb, hpa", func(t *testing.T) {
		svc := find(t, objs, "Service", "memcgate")
		ss := spec[serviceSpec](t, svc)
		if !selects(ss.Selector, pod.Metadata.Labels) {
			t.Errorf("Service selector %v does not select the gateway pods", ss.Selector)
		}
		for _, p := range ss.Ports {
			if c.port(p.TargetPort) == 0 {
				t.Errorf("Service port %s targets %q, which the container does not expose", p.Name, p.TargetPort)
			}
		}
		pdb := spec[struct {
			Selector selector `yaml:"selector"`
		}](t, find(t, objs, "PodDisruptionBudget", "memcgate"))
		if !selects(pdb.Selector.MatchLabels, pod.Metadata.Labels) {
			t.Errorf("PodDisruptionBudget selector %v does not select the gateway pods", pdb.Selector.MatchLabels)
		}
		hpa := spec[struct {
			ScaleTargetRef struct{ Kind, Name string } `yaml:"scaleTargetRef"`
			MinReplicas    int                         `yaml:"minReplicas"`
			MaxReplicas    int                         `yaml:"maxReplicas"`
		}](t, find(t, objs, "HorizontalPodAutoscaler", "memcgate"))
		if hpa.ScaleTargetRef.Kind != "Deployment" || hpa.ScaleTargetRef.Name != dep.Metadata.Name {
			t.Errorf("HPA scales %s %s, want Deployment %s", hpa.ScaleTargetRef.Kind, hpa.ScaleTargetRef.Name, dep.Metadata.Name)
		}
		if hpa.MinReplicas < 2 || hpa.MaxReplicas < hpa.MinReplicas {
			t.Errorf("HPA replicas %d..%d: want at least 2 (the PDB needs one to spare)", hpa.MinReplicas, hpa.MaxReplicas)
		}
		if ds.Replicas != nil {
			t.Error("Deployment sets replicas; with an HPA, kubectl apply would reset the scale")
		}

		// memcached must accept every gateway's connections.
		sts := spec[workloadSpec](t, find(t, objs, "StatefulSet", "memcached"))
		args := sts.Template.Spec.Containers[0].Args
		i := slices.Index(args, "-c")
		if i < 0 || i+1 >= len(args) {
			t.Fatalf("memcached args %v have no -c", args)
		}
		maxConns, _ := strconv.Atoi(args[i+1])
		// Ordinary and large reads' data connections, the probe's, raw
		// commands' and TTL lookups' (docs/operations.md).
		perGateway := 2*cfg.PipelineConns + 7
		if cfg.PipelineConns == 0 {
			perGateway = 2*cfg.MaxConns + 7 // HEADs have a pool of their own
		}
		if need := hpa.MaxReplicas * perGateway; maxConns < need {
			t.Errorf("memcached -c %d < HPA maxReplicas x %d connections per gateway = %d", maxConns, perGateway, need)
		}
	})

	t.Run("stable memcached names", func(t *testing.T) {
		stsObj := find(t, objs, "StatefulSet", "memcached")
		sts := spec[workloadSpec](t, stsObj)
		hs := spec[serviceSpec](t, find(t, objs, "Service", sts.ServiceName))
		if hs.ClusterIP != "None" {
			t.Errorf("Service %s is not headless (clusterIP: None), so pods get no stable names", sts.ServiceName)
		}
		if !selects(hs.Selector, sts.Template.Metadata.Labels) {
			t.Errorf("Service %s does not select the memcached pods", sts.ServiceName)
		}
		if sts.Replicas == nil {
			t.Fatal("memcached StatefulSet sets no replicas")
		}
		var want []string
		port := sts.Template.Spec.Containers[0].port("memcache")
		for i := range *sts.Replicas {
			want = append(want, fmt.Sprintf("%s-%d.%s:%d", stsObj.Metadata.Name, i, sts.ServiceName, port))
		}
		var got []string
		for _, s := range cfg.Servers {
			got = append(got, s.String())
		}
		if !slices.Equal(got, want) {
			t.Errorf("MEMCGATE_SERVERS = %v, want the StatefulSet's stable names %v", got, want)
		}
	})

	t.Run("prometheus", func(t *testing.T) {
		ann := pod.Metadata.Annotations
		if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/path"] != "/metrics" || c.port(ann["prometheus.io/port"]) != c.port("admin") {
			t.Errorf("pod annotations %v: want prometheus.io/scrape, /path /metrics and /port the admin port", ann)
		}
		comp := filepath.Join(k8sDir, "prometheus-operator")
		var k kustomization
		decodeYAML(t, filepath.Join(comp, "kustomization.yaml"), &k)
		if !strings.Contains(read(t, filepath.Join(k8sDir, "kustomization.yaml")), "prometheus-operator") {
			t.Error("kustomization.yaml does not mention the prometheus-operator component")
		}
		var sm object
		decodeYAML(t, filepath.Join(comp, k.Resources[0]), &sm)
		sms := spec[struct {
			Selector  selector `yaml:"selector"`
			Endpoints []struct{ Port, Path string }
		}](t, sm)
		svc := find(t, objs, "Service", "memcgate")
		if sm.Kind != "ServiceMonitor" || !selects(sms.Selector.MatchLabels, svc.Metadata.Labels) {
			t.Errorf("%s does not select Service %s (labels %v)", sm.Kind, svc.Metadata.Name, svc.Metadata.Labels)
		}
		ss := spec[serviceSpec](t, svc)
		for _, e := range sms.Endpoints {
			if !slices.ContainsFunc(ss.Ports, func(p servicePort) bool {
				return p.Name == e.Port && c.port(p.TargetPort) == c.port("admin")
			}) || e.Path != "/metrics" {
				t.Errorf("ServiceMonitor endpoint %s %s: want the Service port that targets admin, path /metrics", e.Port, e.Path)
			}
		}
		var sc struct {
			ScrapeConfigs []struct {
				JobName string `yaml:"job_name"`
			} `yaml:"scrape_configs"`
		}
		decodeYAML(t, filepath.Join(k8sDir, "prometheus-scrape-config.yaml"), &sc)
		var jobs []string
		for _, j := range sc.ScrapeConfigs {
			jobs = append(jobs, j.JobName)
		}
		if !slices.Equal(jobs, []string{"memcgate", "memcached"}) {
			t.Errorf("prometheus-scrape-config.yaml: jobs %v, want memcgate and memcached (the alerts and the dashboard use job=\"memcgate\" and job=\"memcached\")", jobs)
		}
		// The exporters' ServiceMonitor: job memcached is the Service's name.
		var msm object
		decodeYAML(t, filepath.Join(comp, "servicemonitor-memcached.yaml"), &msm)
		if !slices.Contains(k.Resources, "servicemonitor-memcached.yaml") {
			t.Error("the prometheus-operator component does not list servicemonitor-memcached.yaml")
		}
		msms := spec[struct {
			Selector  selector `yaml:"selector"`
			Endpoints []struct{ Port, Path string }
		}](t, msm)
		mcSvc := find(t, objs, "Service", "memcached")
		if msm.Kind != "ServiceMonitor" || !selects(msms.Selector.MatchLabels, mcSvc.Metadata.Labels) || mcSvc.Metadata.Name != "memcached" ||
			len(msms.Endpoints) != 1 || msms.Endpoints[0].Port != "metrics" {
			t.Errorf("servicemonitor-memcached.yaml: %s selecting %v on %+v; want Service memcached's port metrics", msm.Kind, msms.Selector.MatchLabels, msms.Endpoints)
		}
	})

	t.Run("pinned image", func(t *testing.T) {
		for _, img := range k.Images {
			if img.Name != "memcgate" {
				continue
			}
			if img.Digest == "" && !regexp.MustCompile(`^v\d+\.\d+\.\d+$`).MatchString(img.NewTag) {
				t.Errorf("images: memcgate newTag %q: pin a release, vMAJOR.MINOR.PATCH as make image tags it (or a digest), never latest", img.NewTag)
			}
			return
		}
		t.Error("kustomization.yaml has no images entry for memcgate")
	})

	t.Run("network policy", func(t *testing.T) {
		np := find(t, objs, "NetworkPolicy", "")
		type peer struct {
			PodSelector       *selector `yaml:"podSelector"`
			NamespaceSelector *selector `yaml:"namespaceSelector"`
			IPBlock           *struct {
				CIDR string `yaml:"cidr"`
			} `yaml:"ipBlock"`
		}
		nps := spec[struct {
			PodSelector selector `yaml:"podSelector"`
			PolicyTypes []string `yaml:"policyTypes"`
			Ingress     []struct {
				From  []peer `yaml:"from"`
				Ports []struct {
					Port string `yaml:"port"`
				} `yaml:"ports"`
			} `yaml:"ingress"`
		}](t, np)
		if !selects(nps.PodSelector.MatchLabels, pod.Metadata.Labels) || !slices.Contains(nps.PolicyTypes, "Ingress") {
			t.Fatalf("NetworkPolicy %s does not govern the gateway pods' ingress (podSelector %v, policyTypes %v)", np.Metadata.Name, nps.PodSelector.MatchLabels, nps.PolicyTypes)
		}
		dataOpen, adminFromPrometheus := false, false
		for i, r := range nps.Ingress {
			if len(r.Ports) == 0 {
				t.Errorf("ingress rule %d allows every port, the admin port included", i)
			}
			for _, p := range r.Ports {
				switch c.port(p.Port) {
				case c.port("http"):
					dataOpen = dataOpen || len(r.From) == 0
				case c.port("admin"):
					if len(r.From) == 0 {
						t.Errorf("ingress rule %d opens the admin port to everyone", i)
					}
					for _, f := range r.From {
						if f.PodSelector == nil || f.PodSelector.MatchLabels["app.kubernetes.io/name"] != "prometheus" {
							t.Errorf("ingress rule %d admits %+v to the admin port; want Prometheus pods only", i, f)
						} else {
							adminFromPrometheus = true
						}
					}
				default:
					t.Errorf("ingress rule %d names port %q, which the container does not expose", i, p.Port)
				}
			}
		}
		if !dataOpen || !adminFromPrometheus {
			t.Errorf("NetworkPolicy: data port open to all %v, admin port open to Prometheus %v; want both", dataOpen, adminFromPrometheus)
		}
	})

	t.Run("memcached exporter", func(t *testing.T) {
		stsObj := find(t, objs, "StatefulSet", "memcached")
		sts := spec[workloadSpec](t, stsObj)
		var exp *container
		for i, ct := range sts.Template.Spec.Containers {
			if strings.HasPrefix(ct.Image, "quay.io/prometheus/memcached-exporter:") {
				exp = &sts.Template.Spec.Containers[i]
			}
		}
		if exp == nil {
			t.Fatal("the memcached StatefulSet has no quay.io/prometheus/memcached-exporter sidecar")
		}
		if tag := strings.TrimPrefix(exp.Image, "quay.io/prometheus/memcached-exporter:"); tag != exporterVersion {
			t.Errorf("exporter image tag %q: want %s, the version whose metrics the dashboard is checked against (memcachedMetrics in metrics_test.go; update both)", tag, exporterVersion)
		}
		if !slices.Contains(exp.Args, "--memcached.address=localhost:11211") {
			t.Errorf("exporter args %v: want --memcached.address=localhost:11211, its own pod's memcached", exp.Args)
		}
		ann := sts.Template.Metadata.Annotations
		if ann["prometheus.io/scrape"] != "true" || exp.port(ann["prometheus.io/port"]) == 0 || ann["prometheus.io/path"] != "/metrics" {
			t.Errorf("memcached pod annotations %v: want the exporter's port scraped at /metrics", ann)
		}
		hs := spec[serviceSpec](t, find(t, objs, "Service", sts.ServiceName))
		if !slices.ContainsFunc(hs.Ports, func(p servicePort) bool { return p.Name == "metrics" && exp.port(p.TargetPort) != 0 }) {
			t.Errorf("Service %s has no port metrics targeting the exporter, for the ServiceMonitor", sts.ServiceName)
		}
	})

	t.Run("kubectl kustomize", func(t *testing.T) {
		kubectl := gatewaytest.Optional(t, "kubectl")
		abs, err := filepath.Abs(filepath.Join(root, k8sDir))
		if err != nil {
			t.Fatal(err)
		}
		out, err := run(t, abs, kubectl, "kustomize", ".")
		if err != nil {
			t.Fatalf("kubectl kustomize: %v\n%s", err, out)
		}
		if !strings.Contains(out, "kind: Deployment") || !strings.Contains(out, "registry.example.com/memcgate") {
			t.Errorf("kubectl kustomize output lacks the Deployment or the image override:\n%s", out)
		}
		// The generated ConfigMap's name carries the hash, and the
		// Deployment refers to it by that name.
		m := regexp.MustCompile(`(?m)^  name: (memcgate-[a-z0-9]{6,})$`).FindStringSubmatch(out)
		if m == nil || !strings.Contains(out, "name: "+m[1]+"\n") || strings.Count(out, m[1]) < 2 {
			t.Errorf("kubectl kustomize: no ConfigMap memcgate-<hash> referenced by the Deployment:\n%s", out)
		}
		// With the component enabled, from an overlay next to a copy.
		dir := t.TempDir()
		if out, err := run(t, "", "cp", "-r", abs, filepath.Join(dir, "base")); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
		overlay := "resources: [base]\ncomponents: [base/prometheus-operator]\n"
		if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(overlay), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err = run(t, dir, kubectl, "kustomize", ".")
		if err != nil || !strings.Contains(out, "kind: ServiceMonitor") {
			t.Fatalf("kubectl kustomize with the component: %v\n%s", err, out)
		}
	})
}

// memBytes parses a whole number followed by unit (MiB for Go's
// GOMEMLIMIT, Mi for Kubernetes quantities).
func memBytes(v, unit string) (int64, error) {
	n, ok := strings.CutSuffix(v, unit)
	if !ok {
		return 0, fmt.Errorf("%q does not end in %s", v, unit)
	}
	i, err := strconv.ParseInt(n, 10, 64)
	return i << 20, err
}
