// Command h1const is the floor of memcgate's own HTTP server in
// test/bench/bench.sh: gateway/h1 in front of net/http, configured as
// cmd/memcgate configures its data listener (the same accept path, the
// same listener options, the defaults of MEMCGATE_* for the timeouts,
// the header limit and the connection cap), answering every GET with a
// constant body, as long as a value, and no memcached, routing, budget
// or metrics behind it. What memcgate costs above it is the gateway's
// own work; what it costs above nginx's constant body is Go's and h1's.
//
//	h1const -listen 127.0.0.1:P -body FILE [-admin 127.0.0.1:Q]
//
// -admin serves net/http/pprof, to profile it as memcgate is profiled.
// It is a benchmark helper, not part of the gateway.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/memcgate/memcgate/config"
	"github.com/memcgate/memcgate/gateway/h1"
	"github.com/memcgate/memcgate/gateway/listen"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on")
	bodyFile := flag.String("body", "", "file whose bytes every GET answers (required)")
	admin := flag.String("admin", "", "address to serve /debug/pprof/ on (empty: none)")
	flag.Parse()
	if err := run(*listen, *bodyFile, *admin); err != nil {
		fmt.Fprintln(os.Stderr, "h1const:", err)
		os.Exit(1)
	}
}

func run(addr, bodyFile, admin string) error {
	if bodyFile == "" {
		return errors.New("-body is required")
	}
	body, err := os.ReadFile(bodyFile)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg, err := defaults()
	if err != nil {
		return err
	}
	ln, err := listen.TCP(ctx, addr, cfg.SendBufferBytes)
	if err != nil {
		return err
	}
	if admin != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		aln, err := net.Listen("tcp", admin)
		if err != nil {
			ln.Close()
			return err
		}
		go http.Serve(aln, mux)
	}
	return serve(ctx, ln, cfg, body)
}

// defaults is memcgate's configuration with nothing set: a placeholder
// server, which nothing dials, satisfies the one required variable.
func defaults() (config.Config, error) {
	return config.Load(map[string]string{config.Prefix + "SERVERS": "127.0.0.1:11211"})
}

// serve answers every request on ln with body until ctx is done, with
// gateway/h1 and its net/http fallback set up as cmd/memcgate sets them
// up for a data listener without TLS (dataServer there), timeouts,
// header limit and connection cap from cfg.
func serve(ctx context.Context, ln net.Listener, cfg config.Config, body []byte) error {
	h := constant(body)
	std := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.HeadTimeout(),
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ErrorLog:          log.New(os.Stderr, "h1const: ", 0),
	}
	srv := &h1.Server{
		Handler:           h,
		ReadHeaderTimeout: std.ReadHeaderTimeout,
		ReadTimeout:       std.ReadTimeout,
		WriteTimeout:      std.WriteTimeout,
		IdleTimeout:       std.IdleTimeout,
		MaxHeaderBytes:    std.MaxHeaderBytes,
		Fallback:          std,
		ErrorLog:          std.ErrorLog,
		MaxConns:          listen.ConnCap(cfg.MaxClientConns, listen.OpenFileLimit()),
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		srv.Close()
		<-done
		return nil
	}
}

// constant answers every GET or HEAD with body, as memcgate answers a
// hit (200, application/octet-stream, its length), and anything else
// 405.
func constant(body []byte) http.Handler {
	ctype, clen := []string{"application/octet-stream"}, []string{strconv.Itoa(len(body))}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		hd := w.Header()
		hd["Content-Type"], hd["Content-Length"] = ctype, clen
		if r.Method == http.MethodGet {
			w.Write(body)
		}
	})
}
