package route

import (
	"strings"
	"testing"
	"unsafe"

	"github.com/memcgate/memcgate/upstream/op"
)

// TestOwnKeys: work that outlives its request keeps copies of its keys,
// not views into the request's target (kilobytes with a long query
// string), which its budget does not count.
func TestOwnKeys(t *testing.T) {
	target := "/k1?" + strings.Repeat("q", 16<<10)
	o := ownKeys(op.Op{Item: op.Item{Key: target[1:3]}, HashKey: target[1:3]})
	for name, k := range map[string]string{"Item.Key": o.Item.Key, "HashKey": o.HashKey} {
		if k != "k1" {
			t.Errorf("%s = %q, want k1", name, k)
		}
		if unsafe.StringData(k) == unsafe.StringData(target[1:]) {
			t.Errorf("%s shares the request target's %d bytes", name, len(target))
		}
	}
}
