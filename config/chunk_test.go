package config

import (
	"testing"

	"github.com/memcgate/memcgate/gateway/chunk"
)

// TestChunkLimits: the limits config checks values in chunks against are
// package chunk's, which config does not import.
func TestChunkLimits(t *testing.T) {
	if chunkKeyLen != chunk.MaxKeyLen || chunkMaxBytes != chunk.MaxChunkSize || chunkMax != chunk.MaxChunks {
		t.Errorf("config's chunk limits %d, %d, %d; package chunk's %d, %d, %d",
			chunkKeyLen, chunkMaxBytes, chunkMax, chunk.MaxKeyLen, chunk.MaxChunkSize, chunk.MaxChunks)
	}
}
