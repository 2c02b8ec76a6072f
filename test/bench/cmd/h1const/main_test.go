package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/gateway/listen"
)

// h1const answers a GET with the body and a hit's headers, anything but
// GET or HEAD with 405, on a listener with memcgate's options (gateway/listen tests
// those), and
// stops when its context ends.
func TestServe(t *testing.T) {
	cfg, err := defaults()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := listen.TCP(ctx, "127.0.0.1:0", 0)
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Repeat("v", 400)
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, cfg, []byte(body)) }()
	url := "http://" + ln.Addr().String() + "/some-key"
	for _, tc := range []struct {
		method, body string
		status       int
	}{
		{http.MethodGet, body, http.StatusOK},
		{http.MethodHead, "", http.StatusOK},
		{http.MethodPut, "", http.StatusMethodNotAllowed},
	} {
		req, err := http.NewRequest(tc.method, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != tc.status || string(got) != tc.body {
			t.Errorf("%s: %d with %d bytes, want %d with %d", tc.method, resp.StatusCode, len(got), tc.status, len(tc.body))
		}
		if tc.status == http.StatusOK && (resp.Header.Get("Content-Type") != "application/octet-stream" || resp.ContentLength != int64(len(body))) {
			t.Errorf("%s: Content-Type %q, length %d", tc.method, resp.Header.Get("Content-Type"), resp.ContentLength)
		}
	}
	http.DefaultClient.CloseIdleConnections()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve after its context ended: %v", err)
	}
}
