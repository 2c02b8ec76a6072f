package h1_test

import (
	"context"
	"errors"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/memcgate/memcgate/gateway/h1"
)

// A Server and its Fallback share the handler and the limits; draining
// turns keep-alives off before Shutdown.
func ExampleServer() {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("hello\n"))
	})
	fallback := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	srv := &h1.Server{
		Handler:           handler,
		ReadHeaderTimeout: fallback.ReadHeaderTimeout,
		ReadTimeout:       fallback.ReadTimeout,
		WriteTimeout:      fallback.WriteTimeout,
		IdleTimeout:       fallback.IdleTimeout,
		Fallback:          fallback,
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()

	// ... serve until asked to stop, then drain:
	srv.SetKeepAlivesEnabled(false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		log.Print(err)
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		log.Print(err)
	}
}
