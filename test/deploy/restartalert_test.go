package deploy

import "testing"

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
