package deploy

import (
	"fmt"
	"strings"
	"testing"
)

// TestNodeRestartedAlert runs MemcgateMemcachedNodeRestarted through
// promtool's rule unit tests: it fires once per node when gateways see
// its memcached restart (memcgate_upstream_restarts_total, counted by
// each gateway that saw it), without the exporter's series (a systemd or
// compose setup has none), and stops 15 minutes on; a node whose
// counter does not move, and a gateway restarted (its counter back to
// 0), fire nothing.
func TestNodeRestartedAlert(t *testing.T) {
	testAlertRules(t, `tests:
  # mc1 restarts at 10m: both gateways see it. mc2 never restarts; gw2
  # itself restarts at 20m, its counters back to 0.
  - interval: 1m
    input_series:
      - series: 'memcgate_upstream_restarts_total{instance="gw1:9090",node="mc1:11211"}'
        values: '0x10 1x40'
      - series: 'memcgate_upstream_restarts_total{instance="gw2:9090",node="mc1:11211"}'
        values: '0x10 1x10 0x30'
      - series: 'memcgate_upstream_restarts_total{instance="gw1:9090",node="mc2:11211"}'
        values: '0x50'
      - series: 'memcgate_upstream_restarts_total{instance="gw2:9090",node="mc2:11211"}'
        values: '0x20 0x30'
    alert_rule_test:
      - eval_time: 9m
        alertname: MemcgateMemcachedNodeRestarted
        exp_alerts: []
      - eval_time: 12m
        alertname: MemcgateMemcachedNodeRestarted
        exp_alerts:
          - exp_labels: {severity: warning, node: "mc1:11211"}
            exp_annotations:
              runbook_url: "https://github.com/memcgate/memcgate/blob/main/docs/runbook.md#memcgatememcachednoderestarted"
              summary: "memcached mc1:11211 restarted: its cache is empty"
              description: "A gateway's probe found another memcached process answering at mc1:11211 than the one before (its log line \"memcached restarted\" names both pids and starts). Its keys miss until written again, and what stands behind the cache takes those reads. A crash, an OOM kill, a supervisor's restart or a reboot: see the runbook."
      - eval_time: 24m
        alertname: MemcgateMemcachedNodeRestarted
        exp_alerts:
          - exp_labels: {severity: warning, node: "mc1:11211"}
            exp_annotations:
              runbook_url: "https://github.com/memcgate/memcgate/blob/main/docs/runbook.md#memcgatememcachednoderestarted"
              summary: "memcached mc1:11211 restarted: its cache is empty"
              description: "A gateway's probe found another memcached process answering at mc1:11211 than the one before (its log line \"memcached restarted\" names both pids and starts). Its keys miss until written again, and what stands behind the cache takes those reads. A crash, an OOM kill, a supervisor's restart or a reboot: see the runbook."
      - eval_time: 30m
        alertname: MemcgateMemcachedNodeRestarted
        exp_alerts: []
`)
}

// TestOneRestartOneAlert: on Kubernetes, where both the exporter next to
// each memcached and the gateways see a restart, one restart fires one
// alert: MemcgateMemcachedNodeRestarted, the gateways' (by node, with
// their log lines and /debug/nodes behind it).
// MemcgateMemcachedRestarted, the exporter's (by pod), fires only for a
// restart that no gateway counted within a minute: a memcached pod
// whose node no gateway probes, or gateways restarted too. The pod is the
// node's first DNS label (memcached-0.memcached:11211, the StatefulSet's
// stable names). Both fired for every restart.
func TestOneRestartOneAlert(t *testing.T) {
	const gw = `Its keys miss until written again, and what stands behind the cache takes those reads. A crash, an OOM kill, a supervisor's restart or a reboot: see the runbook.`
	testAlertRules(t, `tests:
  # memcached-0 and memcached-1 restart at 10m. The gateways count
  # memcached-0's a minute later (a probe interval and a scrape); no
  # gateway probes memcached-1 (its counter stays 0). memcached-2 does
  # not restart.
  - interval: 1m
    input_series:
      - series: 'memcached_uptime_seconds{instance="10.0.0.10:9150",job="memcached",namespace="cache",pod="memcached-0"}'
        values: '60+60x9 20+60x30'
      - series: 'memcached_uptime_seconds{instance="10.0.0.11:9150",job="memcached",namespace="cache",pod="memcached-1"}'
        values: '60+60x9 20+60x30'
      - series: 'memcached_uptime_seconds{instance="10.0.0.12:9150",job="memcached",namespace="cache",pod="memcached-2"}'
        values: '60+60x40'
      - series: 'memcgate_upstream_restarts_total{instance="gw1:9090",job="memcgate",node="memcached-0.memcached:11211"}'
        values: '0x10 1x30'
      - series: 'memcgate_upstream_restarts_total{instance="gw2:9090",job="memcgate",node="memcached-0.memcached:11211"}'
        values: '0x10 1x30'
      - series: 'memcgate_upstream_restarts_total{instance="gw1:9090",job="memcgate",node="memcached-1.other:11211"}'
        values: '0x40'
      - series: 'memcgate_upstream_restarts_total{instance="gw1:9090",job="memcgate",node="memcached-2.memcached:11211"}'
        values: '0x40'
    alert_rule_test:
      # Before the gateways' count is seen: pending, not firing.
      - eval_time: 10m
        alertname: MemcgateMemcachedRestarted
        exp_alerts: []
      - eval_time: 12m
        alertname: MemcgateMemcachedNodeRestarted
        exp_alerts:
          - exp_labels: {severity: warning, node: "memcached-0.memcached:11211"}
            exp_annotations:
              runbook_url: "https://github.com/memcgate/memcgate/blob/main/docs/runbook.md#memcgatememcachednoderestarted"
              summary: "memcached memcached-0.memcached:11211 restarted: its cache is empty"
              description: "A gateway's probe found another memcached process answering at memcached-0.memcached:11211 than the one before (its log line \"memcached restarted\" names both pids and starts). `+gw+`"
`+exporterRestart(11, "memcached-1")+exporterRestart(24, "memcached-1")+`
      - eval_time: 26m
        alertname: MemcgateMemcachedRestarted
        exp_alerts: []
`)
}

// exporterRestart is an alert_rule_test entry: at minute m,
// MemcgateMemcachedRestarted fires for pod alone.
func exporterRestart(m int, pod string) string {
	n := strings.TrimPrefix(pod, "memcached-")
	return fmt.Sprintf(`      - eval_time: %dm
        alertname: MemcgateMemcachedRestarted
        exp_alerts:
          - exp_labels: {severity: warning, instance: "10.0.0.1%s:9150", job: memcached, namespace: cache, pod: %q}
            exp_annotations:
              runbook_url: "https://github.com/memcgate/memcgate/blob/main/docs/runbook.md#memcgatememcachedrestarted"
              summary: "memcached %s restarted, and no gateway counted it: its cache is empty"
              description: "Its keys miss until written again, and what stands behind the cache takes those reads. Crash, OOM kill, a rollout or a reboot: see the runbook."
`, m, n, pod, pod)
}
