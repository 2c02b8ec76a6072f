package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/memcgate/memcgate/test/gatewaytest"
)

// TestStaleReadsAlert runs MemcgateStaleReadsPossible through promtool's
// rule unit tests: it fires for a returning node whose keys written
// elsewhere were too many to remember, for one away since before the
// gateway started (docs/decisions/0064), even when that re-admission
// came before the process's first scrape (a new pod, whose series starts
// at 1: increase() alone sees nothing), and for a node a reload added
// holding items to a gateway running for long (0065: the node's series
// starts at 1 too); and it stops firing 15 minutes on.
func TestStaleReadsAlert(t *testing.T) {
	testAlertRules(t, `tests:
  # The set of keys written elsewhere filled during an outage.
  - interval: 1m
    input_series:
      - series: 'memcgate_upstream_readmit_untracked_keys_total{instance="gw1:9090",node="mc1:11211"}'
        values: '0x5 40x30'
      - series: 'process_start_time_seconds{instance="gw1:9090"}'
        values: '0x36'
    alert_rule_test:
      - eval_time: 10m
        alertname: MemcgateStaleReadsPossible
        exp_alerts:
          - exp_labels: {severity: warning, instance: "gw1:9090", node: "mc1:11211"}
            exp_annotations: &annotations
              runbook_url: "https://github.com/memcgate/memcgate/blob/main/docs/runbook.md#memcgatestalereadspossible"
              summary: "memcgate gw1:9090: memcached mc1:11211 may serve stale values after its re-admission or addition"
              description: "Keys written to other nodes while it was away were too many to remember, or were written before this gateway started (it was restarted during the outage), or before a reload added it holding items: they may read their old value from it until they expire or are written again. MEMCGATE_READMIT_FLUSH=true flushes a returning or added node instead, so that nothing reads stale; flush_all on the node clears it now."
      - eval_time: 30m
        alertname: MemcgateStaleReadsPossible
        exp_alerts: []
  # A gateway restarted during the outage: the node returned before the
  # first scrape (the series starts at 1), or after it (0, then 1).
  - interval: 1m
    input_series:
      - series: 'memcgate_upstream_readmit_unknown_history_total{instance="gw1:9090",node="mc1:11211"}'
        values: '1x30'
      - series: 'process_start_time_seconds{instance="gw1:9090"}'
        values: '0x30'
      - series: 'memcgate_upstream_readmit_unknown_history_total{instance="gw2:9090",node="mc1:11211"}'
        values: '0x20 1x10'
      - series: 'process_start_time_seconds{instance="gw2:9090"}'
        values: '0x30'
    alert_rule_test:
      - eval_time: 5m
        alertname: MemcgateStaleReadsPossible
        exp_alerts:
          - exp_labels: {severity: warning, instance: "gw1:9090", node: "mc1:11211"}
            exp_annotations: *annotations
      - eval_time: 25m
        alertname: MemcgateStaleReadsPossible
        exp_alerts:
          - exp_labels: {severity: warning, instance: "gw2:9090", node: "mc1:11211"}
            exp_annotations:
              runbook_url: "https://github.com/memcgate/memcgate/blob/main/docs/runbook.md#memcgatestalereadspossible"
              summary: "memcgate gw2:9090: memcached mc1:11211 may serve stale values after its re-admission or addition"
              description: "Keys written to other nodes while it was away were too many to remember, or were written before this gateway started (it was restarted during the outage), or before a reload added it holding items: they may read their old value from it until they expire or are written again. MEMCGATE_READMIT_FLUSH=true flushes a returning or added node instead, so that nothing reads stale; flush_all on the node clears it now."
  # A node added holding items by a reload of a gateway running for an
  # hour: its series starts at 1, and the process is not new.
  - interval: 1m
    input_series:
      - series: 'memcgate_upstream_readmit_unknown_history_total{instance="gw1:9090",node="mc9:11211"}'
        values: '_x60 1x40'
      - series: 'process_start_time_seconds{instance="gw1:9090"}'
        values: '0x100'
    alert_rule_test:
      - eval_time: 65m
        alertname: MemcgateStaleReadsPossible
        exp_alerts:
          - exp_labels: {severity: warning, instance: "gw1:9090", node: "mc9:11211"}
            exp_annotations:
              runbook_url: "https://github.com/memcgate/memcgate/blob/main/docs/runbook.md#memcgatestalereadspossible"
              summary: "memcgate gw1:9090: memcached mc9:11211 may serve stale values after its re-admission or addition"
              description: "Keys written to other nodes while it was away were too many to remember, or were written before this gateway started (it was restarted during the outage), or before a reload added it holding items: they may read their old value from it until they expire or are written again. MEMCGATE_READMIT_FLUSH=true flushes a returning or added node instead, so that nothing reads stale; flush_all on the node clears it now."
      - eval_time: 90m
        alertname: MemcgateStaleReadsPossible
        exp_alerts: []
`)
}

// testAlertRules runs promtool's rule unit tests, tests (a `tests:`
// section of its test file), against the shipped alert rules.
func testAlertRules(t *testing.T, tests string) {
	t.Helper()
	promtool := gatewaytest.Tool(t, "promtool", "prometheus")
	abs, err := filepath.Abs(filepath.Join(root, alertsRel))
	if err != nil {
		t.Fatal(err)
	}
	file := fmt.Sprintf("rule_files:\n  - %q\nevaluation_interval: 1m\n%s", abs, tests)
	path := filepath.Join(t.TempDir(), "alert-rules-test.yaml")
	if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, "", promtool, "test", "rules", path); err != nil {
		t.Errorf("promtool test rules: %v\n%s", err, out)
	}
}
