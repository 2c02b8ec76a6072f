package deploy

import "testing"

// TestRefusalPanicRestartAlerts runs three alerts through promtool's
// rule unit tests. MemcgateRequestsRefused fires on a handful of
// requests refused at MEMCGATE_MAX_REQUESTS, far below the 1 % that
// MemcgateHTTP5xxRatioHigh needs, and stops once they stop; so does
// MemcgateHandlerPanics on one panic. MemcgateMemcachedRestarted fires
// when a node's uptime goes back, the restart quicker than a scrape
// included (the node never seen down), and not for a node that only
// started, whose uptime grows from its first sample.
func TestRefusalPanicRestartAlerts(t *testing.T) {
	testAlertRules(t, `tests:
  # 5 refusals among 100,000 requests a minute: no 5xx ratio alert, this one.
  - interval: 1m
    input_series:
      - series: 'memcgate_http_requests_refused_total{instance="gw1:9090"}'
        values: '0x10 5x30'
      - series: 'memcgate_http_requests_total{instance="gw1:9090",job="memcgate",method="GET",code="200"}'
        values: '0+100000x40'
      - series: 'memcgate_http_requests_total{instance="gw1:9090",job="memcgate",method="GET",code="503"}'
        values: '0x10 5x30'
    alert_rule_test:
      - eval_time: 5m
        alertname: MemcgateRequestsRefused
        exp_alerts: []
      - eval_time: 12m
        alertname: MemcgateRequestsRefused
        exp_alerts:
          - exp_labels: {severity: warning, instance: "gw1:9090"}
            exp_annotations:
              runbook_url: "https://github.com/memcgate/memcgate/blob/main/docs/runbook.md#memcgaterequestsrefused"
              summary: "memcgate gw1:9090 refused 5 requests at MEMCGATE_MAX_REQUESTS"
              description: "Every request slot was taken: memcached answers slower than requests come (slots are held while memcached works), or the load outgrew the cap. Look at the upstream latency first; raise MEMCGATE_MAX_REQUESTS (a reload applies it) or add gateways if the load is legitimate."
      - eval_time: 12m
        alertname: MemcgateHTTP5xxRatioHigh
        exp_alerts: []
      - eval_time: 30m
        alertname: MemcgateRequestsRefused
        exp_alerts: []
  # One panic at 10m, none before or after: gw1's in a handler, gw2's
  # stopped on another goroutine.
  - interval: 1m
    input_series:
      - series: 'memcgate_http_panics_total{instance="gw1:9090"}'
        values: '0x10 1x40'
      - series: 'memcgate_panics_total{instance="gw1:9090",where="detached_end"}'
        values: '0x50'
      - series: 'memcgate_http_panics_total{instance="gw2:9090"}'
        values: '0x50'
      - series: 'memcgate_panics_total{instance="gw2:9090",where="detached_end"}'
        values: '0x10 1x40'
    alert_rule_test:
      - eval_time: 9m
        alertname: MemcgateHandlerPanics
        exp_alerts: []
      - eval_time: 12m
        alertname: MemcgateHandlerPanics
        exp_alerts:
          - exp_labels: {severity: warning, instance: "gw1:9090"}
            exp_annotations:
              runbook_url: "https://github.com/memcgate/memcgate/blob/main/docs/runbook.md#memcgatehandlerpanics"
              summary: "memcgate gw1:9090: 1 requests panicked"
              description: "A bug in the gateway: the requests got 500. The log's \"handler panicked\" or \"panic stopped\" line has the panic and its stack (a line a second at most); file it with memcgate -version."
          - exp_labels: {severity: warning, instance: "gw2:9090"}
            exp_annotations:
              runbook_url: "https://github.com/memcgate/memcgate/blob/main/docs/runbook.md#memcgatehandlerpanics"
              summary: "memcgate gw2:9090: 1 requests panicked"
              description: "A bug in the gateway: the requests got 500. The log's \"handler panicked\" or \"panic stopped\" line has the panic and its stack (a line a second at most); file it with memcgate -version."
      - eval_time: 40m
        alertname: MemcgateHandlerPanics
        exp_alerts: []
  # mc1 restarted between two scrapes (uptime 600 -> 20); mc2 started at
  # 10m and only grows.
  - interval: 1m
    input_series:
      - series: 'memcached_uptime_seconds{instance="mc1:9150"}'
        values: '60+60x9 20+60x30'
      - series: 'memcached_uptime_seconds{instance="mc2:9150"}'
        values: '_x10 5+60x30'
    alert_rule_test:
      - eval_time: 9m
        alertname: MemcgateMemcachedRestarted
        exp_alerts: []
      - eval_time: 12m
        alertname: MemcgateMemcachedRestarted
        exp_alerts:
          - exp_labels: {severity: warning, instance: "mc1:9150"}
            exp_annotations:
              runbook_url: "https://github.com/memcgate/memcgate/blob/main/docs/runbook.md#memcgatememcachedrestarted"
              summary: "memcached mc1:9150 restarted, and no gateway counted it: its cache is empty"
              description: "Its keys miss until written again, and what stands behind the cache takes those reads. Crash, OOM kill, a rollout or a reboot: see the runbook."
      - eval_time: 30m
        alertname: MemcgateMemcachedRestarted
        exp_alerts: []
`)
}
