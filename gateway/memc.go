package gateway

import (
	"context"

	"github.com/go-chi/chi/v5"

	"github.com/memcgate/memcgate/upstream"
)

// MemcCluster is what the HttpMemcModule-compatible endpoints need beyond
// Store: the commands that reach every node. *upstream.Cluster implements it.
type MemcCluster interface {
	FlushAll(ctx context.Context, delay int32) []upstream.NodeReply
	Stats(ctx context.Context) []upstream.NodeReply
	Version(ctx context.Context) []upstream.NodeReply
}

// MemcOptions configures the HttpMemcModule-compatible endpoints.
type MemcOptions struct {
	Path    string      // query-style endpoint, e.g. "/memc"; "" turns it off
	Cluster MemcCluster // required when any endpoint is on
}

// mountMemc adds the compatible endpoints to r.
func (h *handler) mountMemc(r chi.Router, o *MemcOptions) {}
