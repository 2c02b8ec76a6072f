package gateway

import (
	"encoding/json"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestAdminDebugConfig(t *testing.T) {
	tests := []struct {
		name     string
		config   func() any
		want     int
		wantBody map[string]string
	}{
		{"not wired", nil, 404, nil},
		{"the configuration as JSON", func() any { return map[string]string{"MEMCGATE_SERVERS": "a:1"} }, 200, map[string]string{"MEMCGATE_SERVERS": "a:1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := do(NewAdminHandler(prometheus.NewRegistry(), Admin{Config: tt.config}), "GET", "/debug/config", "")
			if w.Code != tt.want {
				t.Fatalf("GET /debug/config = %d %q, want %d", w.Code, w.Body.String(), tt.want)
			}
			if tt.wantBody == nil {
				return
			}
			var got map[string]string
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Header().Get("Content-Type") != "application/json" {
				t.Fatalf("GET /debug/config = %q (%s): %v, want JSON", w.Body.String(), w.Header().Get("Content-Type"), err)
			}
			for k, v := range tt.wantBody {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}
