package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// The surfaces table: one upstream outcome driven through every surface
// that can meet it, each answer checked against the one the docs name
// (docs/http-api.md for the REST API, its multi-get, batch and
// asynchronous writes; docs/migrating-from-nginx-memc.md and the
// module's own behaviour for /memc), on both HTTP server paths. For each
// cell: the status (the batch's or multi-get's result status too), a
// body that names what was wrong, what memcached holds afterwards, and
// the access log line's and memcgate_http_requests_total's status; an
// asynchronous write's memcgate_async_writes_*_total reason as well.

// absent is a surfaceCell.after that wants the key missing from
// memcached.
const absent = "\x00absent"

// surfaceCell is one request of one surface and the answer the docs give
// it. {k} in path and body is the cell's key.
type surfaceCell struct {
	surface string // rest, multiget, batch, async, udp, memc, memc-path
	method  string
	path    string
	body    string
	hdr     []string // name, value pairs

	status int    // the HTTP status
	names  string // a substring of the body (of the first result's error for batch and multiget): what was wrong
	result int    // batch and multiget: the first result's status
	retry  bool   // Retry-After expected (HTTP answers of 503, 502 with it)
	allow  string // the Allow header of a 405
	async  string // async and udp: memcgate_async_writes_failed_total's reason, "applied", "unconfirmed", or "rejected <reason>" (a 503)
	// upstream is the result memcgate_upstream_ops_total counts for the
	// request (ok, miss, rejected, error, timeout), or none for a request
	// that sends nothing to memcached; "" takes the outcome's.
	upstream string

	after string // what memcached holds under the key afterwards: "" unchecked, absent, or the value
}

// surfaceOutcome is one outcome of memcached and the cells that meet it.
type surfaceOutcome struct {
	name     string
	rig      string                                 // which gateway: plain, oom, timeout, refused, down, replicated, owner timeout
	setup    func(t *testing.T, key string, r *rig) // before each cell, nil: nothing
	key      string                                 // the key, when fixed (invalid keys); else one per cell
	owned    bool                                   // the key is one the rig's first node owns
	upstream string                                 // the cells' surfaceCell.upstream, unless they say
	cells    []surfaceCell
}

// rig is a gateway and its memcached nodes.
type rig struct {
	g   *gateway
	mcs []*memcachedtest.Server
	mc  *memcache.Client // to mcs[0]
}

func (r *rig) set(t *testing.T, key, value string) {
	t.Helper()
	if err := r.mc.Set(&memcache.Item{Key: key, Value: []byte(value)}); err != nil {
		t.Fatalf("setup: set %q on memcached: %v", key, err)
	}
}

// held is what memcached holds under key: its value, or absent.
func (r *rig) held(t *testing.T, key string) string {
	t.Helper()
	it, err := r.mc.Get(key)
	if errors.Is(err, memcache.ErrCacheMiss) {
		return absent
	}
	if err != nil {
		t.Fatalf("get %q from memcached: %v", key, err)
	}
	return string(it.Value)
}

const tooBig = 200_000 // over the plain rig's item size (-I 128k), under MEMCGATE_MAX_VALUE_BYTES

func surfaceOutcomes() []surfaceOutcome {
	bigValue := strings.Repeat("b", tooBig)
	setOld := func(t *testing.T, key string, r *rig) { r.set(t, key, "old") }
	setNaN := func(t *testing.T, key string, r *rig) { r.set(t, key, "abc") }
	key251 := strings.Repeat("k", 251)
	wrapped := "1" + strings.Repeat(" ", 19)
	half := strings.Repeat("h", tooBig/2)
	return []surfaceOutcome{
		{name: "miss", upstream: "miss", rig: "plain", cells: []surfaceCell{
			{surface: "rest", method: "GET", path: "/{k}", status: 404, names: "not found", after: absent},
			{surface: "rest", method: "HEAD", path: "/{k}", status: 404},
			{surface: "rest", method: "DELETE", path: "/{k}", status: 404, names: "not found"},
			{surface: "rest", method: "DELETE", path: "/{k}", hdr: []string{"If-Match", "*"}, status: 412, names: "gone"},
			{surface: "rest", method: "GET", path: "/{k}?touch=10", status: 404, names: "not found"},
			{surface: "rest", method: "PUT", path: "/{k}", body: "new", hdr: []string{"If-Match", "*"}, status: 412, names: "does not exist", after: absent},
			{surface: "rest", method: "POST", path: "/{k}?op=incr", status: 404, names: "not found", after: absent},
			{surface: "rest", method: "POST", path: "/{k}?op=append", body: "x", status: 404, names: "not found", after: absent},
			{surface: "rest", method: "POST", path: "/{k}?op=touch&exptime=10", status: 404, names: "not found"},
			// A multi-key get is one command, ok whatever its keys found.
			{surface: "multiget", method: "GET", path: "/?key={k}", status: 200, result: 404, names: "not found", upstream: "ok"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"get","key":"{k}"}]`, status: 200, result: 404, names: "not found", upstream: "ok"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"gat","key":"{k}","exptime":10}]`, status: 200, result: 404, names: "not found"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"touch","key":"{k}","exptime":10}]`, status: 200, result: 404, names: "not found"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"delete","key":"{k}"}]`, status: 200, result: 404, names: "not found"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"replace","key":"{k}","value":"v"}]`, status: 200, result: 412, names: "does not exist", after: absent},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"incr","key":"{k}"}]`, status: 200, result: 404, names: "not found", after: absent},
			{surface: "async", method: "DELETE", path: "/{k}", hdr: []string{"Prefer", "respond-async"}, status: 202, async: "applied", after: absent},
			{surface: "memc", method: "GET", path: "/memc?cmd=get&key={k}", status: 404, names: "404 Not Found"},
			{surface: "memc", method: "HEAD", path: "/memc?cmd=get&key={k}", status: 404},
			{surface: "memc", method: "GET", path: "/memc?cmd=delete&key={k}", status: 404, names: "404 Not Found"},
			{surface: "memc", method: "GET", path: "/memc?cmd=incr&key={k}&val=1", status: 404, names: "404 Not Found", after: absent},
			{surface: "memc", method: "GET", path: "/memc?cmd=replace&key={k}&val=v", status: 200, names: "NOT_STORED\r\n", after: absent},
			{surface: "memc", method: "GET", path: "/memc?cmd=append&key={k}&val=v", status: 200, names: "NOT_STORED\r\n", after: absent},
			{surface: "memc-path", method: "GET", path: "/key/{k}", status: 404, names: "404 Not Found"},
		}},
		{name: "exists", upstream: "rejected", rig: "plain", setup: setOld, cells: []surfaceCell{
			{surface: "rest", method: "PUT", path: "/{k}", body: "new", hdr: []string{"If-None-Match", "*"}, status: 412, names: "key exists", after: "old"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"add","key":"{k}","value":"new"}]`, status: 200, result: 412, names: "key exists", after: "old"},
			// Conditional PUTs ignore the preference.
			{surface: "async", method: "PUT", path: "/{k}", body: "new", hdr: []string{"Prefer", "respond-async", "If-None-Match", "*"}, status: 412, names: "key exists", after: "old"},
			{surface: "memc", method: "GET", path: "/memc?cmd=add&key={k}&val=new", status: 200, names: "NOT_STORED\r\n", after: "old"},
			{surface: "memc-path", method: "POST", path: "/key/{k}", body: "new", status: 200, names: "NOT_STORED\r\n", after: "old"},
		}},
		{name: "cas mismatch", upstream: "rejected", rig: "plain", setup: setOld, cells: []surfaceCell{
			{surface: "rest", method: "PUT", path: "/{k}", body: "new", hdr: []string{"If-Match", `"999999999"`}, status: 412, names: "item changed", after: "old"},
			{surface: "rest", method: "DELETE", path: "/{k}", hdr: []string{"If-Match", `"999999999"`}, status: 412, names: "item changed", after: "old"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"cas","key":"{k}","value":"new","cas":"999999999"}]`, status: 200, result: 412, names: "item changed", after: "old"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"delete","key":"{k}","cas":"999999999"}]`, status: 200, result: 412, names: "item changed", after: "old"},
			{surface: "async", method: "PUT", path: "/{k}", body: "new", hdr: []string{"Prefer", "respond-async", "If-Match", `"999999999"`}, status: 412, names: "item changed", after: "old"},
			{surface: "async", method: "DELETE", path: "/{k}", hdr: []string{"Prefer", "respond-async", "If-Match", `"999999999"`}, status: 412, names: "item changed", after: "old"},
			// The module has no cas: an unknown command.
			{surface: "memc", method: "GET", path: "/memc?cmd=cas&key={k}&val=new", status: 400, names: "400 Bad Request", after: "old", upstream: "none"},
		}},
		{name: "too large for an item", upstream: "rejected", rig: "plain", setup: setOld, cells: []surfaceCell{
			// memcached deletes the item a set too large for it
			// replaces (httpmemc.md §3): the old value is gone.
			{surface: "rest", method: "PUT", path: "/{k}", body: bigValue, status: 413, names: "the key is now missing", after: absent},
			// memcached checks the size first; an add leaves the item.
			{surface: "rest", method: "PUT", path: "/{k}", body: bigValue, hdr: []string{"If-None-Match", "*"}, status: 413, names: "too large for an item", after: "old"},
			{surface: "rest", method: "POST", path: "/{k}?op=append", body: bigValue, status: 413, names: "too large for an item", after: "old"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"set","key":"{k}","value":"` + bigValue + `"}]`, status: 200, result: 413, names: "the key is now missing", after: absent},
			{surface: "async", method: "PUT", path: "/{k}", body: bigValue, hdr: []string{"Prefer", "respond-async"}, status: 202, async: "refused", after: absent},
			{surface: "udp", method: "PUT", path: "/{k}", body: bigValue, hdr: []string{"Prefer", "respond-async"}, status: 202, async: "refused", after: absent},
			// The query style takes the value from ?val= (absent: empty),
			// as the module's reference configuration does; a large value
			// comes in the body, on the path style.
			{surface: "memc-path", method: "PUT", path: "/key/{k}", body: bigValue, status: 502, names: "SERVER_ERROR object too large for cache\r\n", after: absent},
			{surface: "memc-path", method: "PUT", path: "/key/{k}?cmd=append", body: bigValue, status: 502, names: "SERVER_ERROR object too large for cache\r\n", after: "old"},
		}},
		{name: "append past the item size", upstream: "miss", rig: "plain", setup: func(t *testing.T, key string, r *rig) { r.set(t, key, half) }, cells: []surfaceCell{
			// memcached answers NOT_STORED, as to a missing item.
			{surface: "rest", method: "POST", path: "/{k}?op=append", body: half, status: 404, names: "item size", after: half},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"append","key":"{k}","value":"` + half + `"}]`, status: 200, result: 404, names: "item size", after: half},
			{surface: "memc-path", method: "PUT", path: "/key/{k}?cmd=append", body: half, status: 200, names: "NOT_STORED\r\n", after: half},
		}},
		{name: "out of memory", upstream: "rejected", rig: "oom", cells: []surfaceCell{
			{surface: "rest", method: "PUT", path: "/{k}", body: "{big}", status: 503, retry: true, names: "no memory", after: absent},
			{surface: "rest", method: "PUT", path: "/{k}", body: "{big}", hdr: []string{"If-None-Match", "*"}, status: 503, retry: true, names: "no memory", after: absent},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"add","key":"{k}","value":"{big}"}]`, status: 200, result: 503, names: "no memory", after: absent},
			{surface: "memc-path", method: "POST", path: "/key/{k}", body: "{big}", status: 502, names: "SERVER_ERROR out of memory storing object\r\n", after: absent},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"set","key":"{k}","value":"{big}"}]`, status: 200, result: 503, names: "no memory", after: absent},
			{surface: "async", method: "PUT", path: "/{k}", body: "{big}", hdr: []string{"Prefer", "respond-async"}, status: 202, async: "refused", after: absent},
			// A datagram is not answered: a set memcached refused would not
			// be told either (http-api.md, UDP sets); this one is counted
			// neither applied nor failed.
			{surface: "udp", method: "PUT", path: "/{k}", body: "small", hdr: []string{"Prefer", "respond-async"}, status: 202, async: "unconfirmed", upstream: "ok"},
			{surface: "memc-path", method: "PUT", path: "/key/{k}", body: "{big}", status: 502, names: "SERVER_ERROR out of memory storing object\r\n", after: absent},
		}},
		{name: "incr of a non-number", upstream: "rejected", rig: "plain", setup: setNaN, cells: []surfaceCell{
			{surface: "rest", method: "POST", path: "/{k}?op=incr", status: 409, names: "not a decimal number", after: "abc"},
			{surface: "rest", method: "POST", path: "/{k}?op=decr", status: 409, names: "not a decimal number", after: "abc"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"incr","key":"{k}","delta":1}]`, status: 200, result: 409, names: "not a decimal number", after: "abc"},
			{surface: "memc", method: "GET", path: "/memc?cmd=incr&key={k}&val=1", status: 502, names: "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n", after: "abc"},
		}},
		{name: "incr past 2^64-1", upstream: "ok", rig: "plain", setup: func(t *testing.T, key string, r *rig) { r.set(t, key, "18446744073709551615") }, cells: []surfaceCell{
			// It wraps, and memcached pads the shorter number with
			// spaces in place.
			{surface: "rest", method: "POST", path: "/{k}?op=incr&delta=2", status: 200, names: "1", after: wrapped},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"incr","key":"{k}","delta":2}]`, status: 200, result: 200, after: wrapped},
			{surface: "memc", method: "GET", path: "/memc?cmd=incr&key={k}&val=2", status: 201, names: "1\r\n", after: wrapped},
			// A delta past 2^64-1 is refused before memcached.
			{surface: "rest", method: "POST", path: "/{k}?op=incr&delta=18446744073709551616", status: 400, names: "delta", after: "18446744073709551615", upstream: "none"},
		}},
		{name: "decr below 0", upstream: "ok", rig: "plain", setup: func(t *testing.T, key string, r *rig) { r.set(t, key, "5") }, cells: []surfaceCell{
			{surface: "rest", method: "POST", path: "/{k}?op=decr&delta=10", status: 200, names: "0", after: "0"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"decr","key":"{k}","delta":10}]`, status: 200, result: 200, after: "0"},
			{surface: "memc", method: "GET", path: "/memc?cmd=decr&key={k}&val=10", status: 201, names: "0\r\n", after: "0"},
		}},
		{name: "key with a space", upstream: "none", rig: "plain", key: "a b", cells: []surfaceCell{
			{surface: "rest", method: "GET", path: "/a%20b", status: 400, names: "key"},
			{surface: "rest", method: "HEAD", path: "/a%20b", status: 400},
			{surface: "rest", method: "PUT", path: "/a%20b", body: "v", status: 400, names: "key"},
			{surface: "multiget", method: "GET", path: "/?key=a%20b", status: 400, names: "cannot contain spaces"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"set","key":"a b","value":"v"}]`, status: 200, result: 400, names: "key"},
			{surface: "async", method: "PUT", path: "/a%20b", body: "v", hdr: []string{"Prefer", "respond-async"}, status: 400, names: "key"},
			{surface: "async", method: "POST", path: "/", body: `[{"op":"set","key":"a b","value":"v"}]`, hdr: []string{"Prefer", "respond-async"}, status: 400, names: "key"},
			{surface: "udp", method: "DELETE", path: "/a%20b", hdr: []string{"Prefer", "respond-async"}, status: 400, names: "key"},
			// The module escapes a space in the key (%20): never invalid.
		}},
		{name: "key with a control byte", upstream: "none", rig: "plain", key: "a\x01b", cells: []surfaceCell{
			{surface: "rest", method: "GET", path: "/a%01b", status: 400, names: "key"},
			{surface: "rest", method: "PUT", path: "/a%01b", body: "v", status: 400, names: "key"},
			{surface: "rest", method: "PUT", path: "/a%7Fb", body: "v", status: 400, names: "key"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"set","key":"a\u007fb","value":"v"}]`, status: 200, result: 400, names: "key"},
			{surface: "multiget", method: "GET", path: "/?key=a%01b", status: 400, names: "control bytes"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"set","key":"a\u0001b","value":"v"}]`, status: 200, result: 400, names: "key"},
			{surface: "async", method: "PUT", path: "/a%01b", body: "v", hdr: []string{"Prefer", "respond-async"}, status: 400, names: "key"},
		}},
		{name: "key of 251 bytes", upstream: "none", rig: "plain", key: key251, cells: []surfaceCell{
			{surface: "rest", method: "GET", path: "/" + key251, status: 400, names: "key"},
			{surface: "rest", method: "PUT", path: "/" + key251, body: "v", status: 400, names: "key"},
			{surface: "multiget", method: "GET", path: "/?key=" + key251, status: 400, names: "251 bytes"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"set","key":"` + key251 + `","value":"v"}]`, status: 200, result: 400, names: "key"},
			{surface: "async", method: "PUT", path: "/" + key251, body: "v", hdr: []string{"Prefer", "respond-async"}, status: 400, names: "key"},
			// The module's answers: memcached's line for a write, an
			// invalid reply (a page) for get.
			{surface: "memc", method: "GET", path: "/memc?cmd=set&key=" + key251 + "&val=v", status: 502, names: "CLIENT_ERROR bad command line format\r\n"},
			{surface: "memc", method: "GET", path: "/memc?cmd=get&key=" + key251, status: 502, names: "502 Bad Gateway"},
			{surface: "memc-path", method: "PUT", path: "/key/" + key251, body: "v", status: 502, names: "CLIENT_ERROR bad command line format\r\n"},
		}},
		{name: "empty key", upstream: "none", rig: "plain", key: "-", cells: []surfaceCell{
			// "/" is the multi-get's and the batch's: no key there.
			{surface: "rest", method: "PUT", path: "/", body: "v", status: 405, allow: "GET, POST", names: "not allowed on /"},
			{surface: "rest", method: "DELETE", path: "/", status: 405, allow: "GET, POST", names: "not allowed on /"},
			{surface: "rest", method: "HEAD", path: "/", status: 405, allow: "GET, POST"},
			{surface: "multiget", method: "GET", path: "/?key=", status: 400, names: "empty key"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"set","key":"","value":"v"}]`, status: 200, result: 400, names: "key"},
			{surface: "memc", method: "GET", path: "/memc?cmd=get&key=", status: 500, names: "500 Internal Server Error"},
			{surface: "memc", method: "GET", path: "/memc?cmd=set&key=&val=v", status: 500, names: "500 Internal Server Error"},
		}},
		{name: "node timeout", upstream: "timeout", rig: "timeout", cells: []surfaceCell{
			{surface: "rest", method: "GET", path: "/{k}", status: 504, names: "did not answer in time"},
			{surface: "rest", method: "HEAD", path: "/{k}", status: 504},
			{surface: "rest", method: "PUT", path: "/{k}", body: "v", status: 504, names: "did not answer in time"},
			// Sent, and not answered: the body says so.
			{surface: "rest", method: "PUT", path: "/{k}", body: "v", status: 504, names: "may or may not have been applied"},
			{surface: "rest", method: "DELETE", path: "/{k}", status: 504, names: "did not answer in time"},
			{surface: "rest", method: "DELETE", path: "/{k}", hdr: []string{"If-Match", `"999999999"`}, status: 504, names: "did not answer in time"},
			{surface: "rest", method: "POST", path: "/{k}?op=incr", status: 504, names: "did not answer in time"},
			{surface: "async", method: "DELETE", path: "/{k}", hdr: []string{"Prefer", "respond-async"}, status: 202, async: "timeout"},
			{surface: "memc-path", method: "GET", path: "/key/{k}", status: 504, names: "504 Gateway Time-out"},
			{surface: "memc", method: "GET", path: "/memc?cmd=version", status: 504, names: "504 Gateway Time-out"},
			{surface: "memc", method: "GET", path: "/memc?cmd=stats", status: 504, names: "504 Gateway Time-out"},
			{surface: "memc", method: "GET", path: "/memc?cmd=flush_all", status: 504, names: "504 Gateway Time-out"},
			{surface: "multiget", method: "GET", path: "/?key={k}", status: 503, result: 504, names: "did not answer in time"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"set","key":"{k}","value":"v"}]`, status: 503, result: 504, names: "did not answer in time"},
			{surface: "async", method: "PUT", path: "/{k}", body: "v", hdr: []string{"Prefer", "respond-async"}, status: 202, async: "timeout"},
			{surface: "memc", method: "GET", path: "/memc?cmd=get&key={k}", status: 504, names: "504 Gateway Time-out"},
			{surface: "memc", method: "GET", path: "/memc?cmd=set&key={k}&val=v", status: 504, names: "504 Gateway Time-out"},
		}},
		{name: "node refused", upstream: "error", rig: "refused", cells: []surfaceCell{
			{surface: "rest", method: "GET", path: "/{k}", status: 502, retry: true, names: "connection failed"},
			{surface: "rest", method: "HEAD", path: "/{k}", status: 502, retry: true},
			{surface: "rest", method: "PUT", path: "/{k}", body: "v", status: 502, retry: true, names: "connection failed"},
			{surface: "multiget", method: "GET", path: "/?key={k}", status: 503, retry: true, result: 502, names: "connection failed"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"set","key":"{k}","value":"v"}]`, status: 503, retry: true, result: 502, names: "connection failed"},
			{surface: "memc", method: "GET", path: "/memc?cmd=get&key={k}", status: 502, names: "502 Bad Gateway"},
			{surface: "memc", method: "GET", path: "/memc?cmd=set&key={k}&val=v", status: 502, names: "502 Bad Gateway"},
		}},
		{name: "all nodes down", upstream: "none", rig: "down", cells: []surfaceCell{
			{surface: "rest", method: "GET", path: "/{k}", status: 503, retry: true, names: "no memcached node"},
			{surface: "rest", method: "HEAD", path: "/{k}", status: 503, retry: true},
			{surface: "rest", method: "PUT", path: "/{k}", body: "v", status: 503, retry: true, names: "no memcached node"},
			{surface: "rest", method: "DELETE", path: "/{k}", status: 503, retry: true, names: "no memcached node"},
			{surface: "rest", method: "POST", path: "/{k}?op=incr", status: 503, retry: true, names: "no memcached node"},
			{surface: "async", method: "DELETE", path: "/{k}", hdr: []string{"Prefer", "respond-async"}, status: 503, retry: true, names: "node", async: "rejected node_down"},
			{surface: "async", method: "POST", path: "/", body: `[{"op":"set","key":"{k}","value":"v"}]`, hdr: []string{"Prefer", "respond-async"}, status: 503, retry: true, names: "node", async: "rejected node_down"},
			{surface: "memc-path", method: "GET", path: "/key/{k}", status: 502, names: "502 Bad Gateway"},
			{surface: "memc", method: "GET", path: "/memc?cmd=version", status: 502, names: "502 Bad Gateway"},
			{surface: "memc", method: "GET", path: "/memc?cmd=stats", status: 502, names: "502 Bad Gateway"},
			{surface: "memc", method: "GET", path: "/memc?cmd=flush_all", status: 502, names: "502 Bad Gateway"},
			{surface: "multiget", method: "GET", path: "/?key={k}", status: 503, retry: true, result: 503, names: "no memcached node"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"set","key":"{k}","value":"v"}]`, status: 503, retry: true, result: 503, names: "no memcached node"},
			{surface: "async", method: "PUT", path: "/{k}", body: "v", hdr: []string{"Prefer", "respond-async"}, status: 503, retry: true, names: "node", async: "rejected node_down"},
			{surface: "memc", method: "GET", path: "/memc?cmd=get&key={k}", status: 502, names: "502 Bad Gateway"},
			{surface: "memc", method: "GET", path: "/memc?cmd=set&key={k}&val=v", status: 502, names: "502 Bad Gateway"},
		}},
		{name: "replicated write partly applied", upstream: "timeout", rig: "replicated", cells: []surfaceCell{
			{surface: "rest", method: "PUT", path: "/{k}", body: "v", status: 504, names: "partly applied", after: "v"},
			{surface: "rest", method: "DELETE", path: "/{k}", status: 504, names: "partly applied"},
			{surface: "rest", method: "POST", path: "/{k}?op=append", body: "x", status: 504, names: "partly applied"},
			// The replica that answered was reached: the batch is 200,
			// the write's own result the single-key answer.
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"delete","key":"{k}"}]`, status: 200, result: 504, names: "partly applied"},
			{surface: "memc", method: "GET", path: "/memc?cmd=delete&key={k}", status: 504, names: "partly applied"},
			{surface: "memc-path", method: "PUT", path: "/key/{k}", body: "v", status: 504, names: "partly applied", after: "v"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"set","key":"{k}","value":"v"}]`, status: 200, result: 504, names: "partly applied", after: "v"},
			{surface: "async", method: "PUT", path: "/{k}", body: "v", hdr: []string{"Prefer", "respond-async"}, status: 202, async: "timeout", after: "v"},
			{surface: "memc", method: "GET", path: "/memc?cmd=set&key={k}&val=v", status: 504, names: "partly applied", after: "v"},
		}},
		// The key's owner, in service, cannot be connected to in time
		// (stopped, its backlog full): a write answers that timeout and
		// is not stored on the next node, where no read would find it
		// while the owner serves its older value (decisions/0086).
		// after is what the next node holds.
		{name: "owner timeout", upstream: "timeout", rig: "owner timeout", owned: true, cells: []surfaceCell{
			{surface: "rest", method: "PUT", path: "/{k}", body: "v", status: 504, names: "the write was not sent", after: absent},
			{surface: "rest", method: "PUT", path: "/{k}", body: "v", hdr: []string{"If-None-Match", "*"}, status: 504, names: "the write was not sent", after: absent},
			{surface: "rest", method: "DELETE", path: "/{k}", status: 504, names: "the write was not sent"},
			{surface: "rest", method: "POST", path: "/{k}?op=incr", status: 504, names: "the write was not sent"},
			{surface: "batch", method: "POST", path: "/", body: `[{"op":"set","key":"{k}","value":"v"}]`, status: 503, result: 504, names: "the write was not sent", after: absent},
			{surface: "async", method: "PUT", path: "/{k}", body: "v", hdr: []string{"Prefer", "respond-async"}, status: 202, async: "timeout", after: absent},
			{surface: "memc", method: "GET", path: "/memc?cmd=set&key={k}&val=v", status: 504, names: "504 Gateway Time-out", after: absent},
		}},
	}
}

// TestSurfacesAgree runs surfaceOutcomes on both HTTP server paths (the
// h1 fast path and net/http): see the top of the file.
func TestSurfacesAgree(t *testing.T) {
	t.Parallel()
	for _, fast := range []string{"true", "false"} {
		t.Run("FAST_PATH="+fast, func(t *testing.T) {
			t.Parallel() // each server path has rigs of its own
			rigs := map[string]*rig{}
			for _, o := range surfaceOutcomes() {
				if rigs[o.rig] == nil && o.rig != "refused" {
					rigs[o.rig] = startRig(t, o.rig, fast)
				}
				t.Run(o.name, func(t *testing.T) {
					for i, c := range o.cells {
						if c.surface == "udp" && fast == "false" {
							continue // one server path is enough for datagrams
						}
						name := fmt.Sprintf("%d-%s-%s", i, c.surface, c.method)
						t.Run(name, func(t *testing.T) {
							r := rigs[o.rig]
							if o.rig == "refused" {
								r = startRig(t, o.rig, fast) // a refusal takes the node down: a rig per cell
							}
							key := o.key
							if key == "" {
								key = fmt.Sprintf("s%s-%d-%s", strings.ReplaceAll(o.name, " ", "_"), i, fast)
							}
							for j := 0; o.owned && r.g.owner(key) != r.mcs[0].Addr; j++ {
								key = fmt.Sprintf("s%s-%d-%s-%d", strings.ReplaceAll(o.name, " ", "_"), i, fast, j)
							}
							if o.setup != nil {
								o.setup(t, key, r)
							}
							if o.rig == "refused" {
								r.mcs[0].Kill()
							}
							runCell(t, r, c, key, o.upstream, fast)
						})
					}
				})
			}
		})
	}
}

// startRig starts the memcached nodes and the gateway of rig name, in the
// state the outcome needs.
func startRig(t *testing.T, name, fast string) *rig {
	t.Helper()
	env := map[string]string{
		"MEMCGATE_FAST_PATH":     fast,
		"MEMCGATE_MEMC_KEY_PATH": "/key/",
		"MEMCGATE_LOG_FORMAT":    "json",
	}
	r := &rig{}
	switch name {
	case "plain":
		mc := memcachedtest.StartUDP(t, "-I", "128k", "-o", "slab_chunk_max=65536")
		r.mcs = []*memcachedtest.Server{mc}
		env["MEMCGATE_UDP_PORTS"] = mc.Addr + "=" + strconv.Itoa(mc.UDPPort)
	case "oom":
		mc := memcachedtest.StartUDP(t, "-M", "-m", "2")
		r.mcs = []*memcachedtest.Server{mc}
		env["MEMCGATE_UDP_PORTS"] = mc.Addr + "=" + strconv.Itoa(mc.UDPPort)
	case "timeout", "refused":
		r.mcs = []*memcachedtest.Server{memcachedtest.Start(t)}
		// Nothing takes the node down but the request's own failure.
		env["MEMCGATE_PASSIVE_FAILS"] = "0"
		env["MEMCGATE_HEALTH_INTERVAL"] = "10m"
		env["MEMCGATE_TIMEOUT"] = "200ms"
		env["MEMCGATE_REQUEST_TIMEOUT"] = "1s"
	case "down":
		r.mcs = []*memcachedtest.Server{memcachedtest.Start(t)}
	case "owner timeout":
		// A backlog of one: stopped, it takes two connections, and every
		// dial after them times out.
		r.mcs = memcachedtest.StartN(t, 2, "-b", "1")
		env["MEMCGATE_PASSIVE_FAILS"] = "0"
		env["MEMCGATE_HEALTH_INTERVAL"] = "10m"
		env["MEMCGATE_TIMEOUT"] = "200ms"
		env["MEMCGATE_REQUEST_TIMEOUT"] = "1s"
	case "replicated":
		r.mcs = memcachedtest.StartN(t, 2)
		env["MEMCGATE_REPLICAS"] = "2"
		env["MEMCGATE_WRITE_POLICY"] = "all"
		env["MEMCGATE_PASSIVE_FAILS"] = "0"
		env["MEMCGATE_HEALTH_INTERVAL"] = "10m"
		env["MEMCGATE_TIMEOUT"] = "200ms"
		env["MEMCGATE_REQUEST_TIMEOUT"] = "1s"
	}
	env["MEMCGATE_SERVERS"] = memcachedtest.Addrs(r.mcs)
	r.g = startGateway(t, env)
	r.mc = memcachedClient(t, r.mcs[0].Addr)
	switch name {
	case "oom":
		// Fill it: every slab page taken, nothing to evict (-M).
		v := bytes.Repeat([]byte("f"), 500_000)
		for i := 0; i < 40; i++ {
			if err := r.mc.Set(&memcache.Item{Key: fmt.Sprint("fill", i), Value: v}); err != nil {
				break
			}
		}
	case "timeout":
		r.g.do("PUT", "/warm", []byte("v")) // connections made before the node stops
		r.mcs[0].Pause()
		t.Cleanup(r.mcs[0].Resume)
	case "refused":
		r.g.do("PUT", "/warm", []byte("v"))
	case "down":
		r.mcs[0].Kill()
		deadline := time.Now().Add(5 * time.Second)
		for r.g.do("GET", "/k", nil).status != 503 {
			if time.Now().After(deadline) {
				t.Fatal("the gateway did not take its killed node down")
			}
			time.Sleep(20 * time.Millisecond)
		}
	case "replicated":
		r.g.do("PUT", "/warm", []byte("v"))
		r.mcs[1].Pause()
		t.Cleanup(r.mcs[1].Resume)
	case "owner timeout":
		// No data connection to the owner was made: each write dials.
		r.mcs[0].Pause()
		t.Cleanup(r.mcs[0].Resume)
		r.mcs[0].FillBacklog()
		r.mc = memcachedClient(t, r.mcs[1].Addr) // what the next node holds
	}
	return r
}

// runCell sends c's request for key and checks every part of its answer.
func runCell(t *testing.T, r *rig, c surfaceCell, key, upstream, fast string) {
	t.Helper()
	expand := func(s string) string {
		s = strings.ReplaceAll(s, "{k}", key)
		return strings.ReplaceAll(s, "{big}", strings.Repeat("m", 400_000))
	}
	path, body := expand(c.path), expand(c.body)
	reqID := fmt.Sprintf("surf-%s-%d", fast, time.Now().UnixNano())
	before := r.metrics(t)
	if c.upstream == "" {
		c.upstream = upstream
	}
	req, err := http.NewRequest(c.method, r.g.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.body != "" {
		req, _ = http.NewRequest(c.method, r.g.URL+path, strings.NewReader(body))
	}
	req.Header.Set("X-Request-Id", reqID)
	for i := 0; i+1 < len(c.hdr); i += 2 {
		req.Header.Set(c.hdr[i], c.hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", c.method, path, err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	what := fmt.Sprintf("%s %s (%s)", c.method, shorten(path), c.surface)
	if route, spec := openAPIRoute(c), openAPIStatuses(t); route != "" && spec[c.method+" "+route] && !spec[c.method+" "+route+" "+strconv.Itoa(resp.StatusCode)] {
		t.Errorf("%s %s = %d: docs/openapi.json does not document %d for %s %s", c.method, shorten(path), resp.StatusCode, resp.StatusCode, c.method, route)
	}
	if resp.StatusCode != c.status {
		t.Errorf("%s = %d %q, want %d", what, resp.StatusCode, shorten(string(got)), c.status)
	}
	if c.retry != (resp.Header.Get("Retry-After") != "") {
		t.Errorf("%s: Retry-After %q, want it %v", what, resp.Header.Get("Retry-After"), c.retry)
	}
	if a := resp.Header.Get("Allow"); a != c.allow {
		t.Errorf("%s: Allow %q, want %q", what, a, c.allow)
	}
	text := string(got)
	if c.result != 0 {
		var res struct {
			Results []struct {
				Status int    `json:"status"`
				Error  string `json:"error"`
			} `json:"results"`
		}
		if err := json.Unmarshal(got, &res); err != nil || len(res.Results) == 0 {
			t.Fatalf("%s = %d %q: not results JSON (%v)", what, resp.StatusCode, shorten(text), err)
		}
		if res.Results[0].Status != c.result {
			t.Errorf("%s: result %d %q, want %d", what, res.Results[0].Status, res.Results[0].Error, c.result)
		}
		text = res.Results[0].Error
	}
	if c.names != "" && !strings.Contains(text, c.names) {
		t.Errorf("%s: body %q, want it to name %q", what, shorten(text), c.names)
	}
	if c.async != "" {
		name, labels := "memcgate_async_writes_failed_total", `reason="`+c.async+`"`
		if reason, ok := strings.CutPrefix(c.async, "rejected "); ok {
			name, labels = "memcgate_async_writes_rejected_total", `reason="`+reason+`"`
		}
		switch c.async {
		case "applied":
			name, labels = "memcgate_async_writes_applied_total", ""
		case "unconfirmed":
			name, labels = "memcgate_async_writes_unconfirmed_total", ""
		}
		deadline := time.Now().Add(5 * time.Second)
		for sample(r.metrics(t), name, labels)-sample(before, name, labels) < 1 {
			if time.Now().After(deadline) {
				t.Errorf("%s: %s{%s} did not count the write (failed: %v)", what, name, labels, asyncFailed(r.metrics(t)))
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// memcgate_http_requests_total and the access log count the status sent.
	after := r.metrics(t)
	switch ops := "memcgate_upstream_ops_total"; c.upstream {
	case "":
	case "none":
		if n := sample(after, ops, "") - sample(before, ops, ""); n != 0 {
			t.Errorf("%s: %s rose by %v, want it unchanged: nothing sent to memcached", what, ops, n)
		}
	default:
		if n := sample(after, ops, `result="`+c.upstream+`"`) - sample(before, ops, `result="`+c.upstream+`"`); n < 1 {
			t.Errorf("%s: %s{result=%q} did not rise", what, ops, c.upstream)
		}
	}
	codeLabels := fmt.Sprintf(`code="%d",method="%s"`, resp.StatusCode, c.method)
	if n := sample(after, "memcgate_http_requests_total", codeLabels) - sample(before, "memcgate_http_requests_total", codeLabels); n != 1 {
		t.Errorf("%s: memcgate_http_requests_total{%s} rose by %v, want 1", what, codeLabels, n)
	}
	if st, ok := accessStatus(t, r, reqID); !ok || st != resp.StatusCode {
		t.Errorf("%s: access log status %d (found %v), want %d", what, st, ok, resp.StatusCode)
	}
	if c.after != "" {
		if h := r.held(t, key); h != c.after {
			t.Errorf("%s: memcached holds %q afterwards, want %q", what, shorten(h), shorten(c.after))
		}
	}
}

// openAPIRoute is the docs/openapi.json path of c's request, or "" for
// the HttpMemc endpoints, which it does not describe.
func openAPIRoute(c surfaceCell) string {
	switch {
	case strings.HasPrefix(c.surface, "memc"):
		return ""
	case c.path == "/" || strings.HasPrefix(c.path, "/?"):
		return "/"
	}
	return "/{key}"
}

// openAPIStatuses is the set of "METHOD path status" docs/openapi.json
// documents, and of "METHOD path" it describes.
func openAPIStatuses(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../../docs/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatalf("docs/openapi.json: %v", err)
	}
	out := map[string]bool{}
	for path, methods := range spec.Paths {
		for method, raw := range methods {
			var op struct {
				Responses map[string]json.RawMessage `json:"responses"`
			}
			if json.Unmarshal(raw, &op) != nil {
				continue // "parameters"
			}
			out[strings.ToUpper(method)+" "+path] = true
			for status := range op.Responses {
				out[strings.ToUpper(method)+" "+path+" "+status] = true
			}
		}
	}
	return out
}

// metrics is the gateway's /metrics text.
func (r *rig) metrics(t *testing.T) string {
	t.Helper()
	m, err := r.g.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// sample is the sum of name's samples whose labels contain labels.
func sample(text, name, labels string) float64 {
	var sum float64
	for line := range strings.Lines(text) {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest[0] != '{' && rest[0] != ' ') || !strings.Contains(rest, labels) {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) > 0 {
			v, _ := strconv.ParseFloat(f[0], 64)
			sum += v
		}
	}
	return sum
}

// asyncFailed lists memcgate_async_writes_failed_total's nonzero reasons.
func asyncFailed(text string) []string {
	var out []string
	for line := range strings.Lines(text) {
		if strings.HasPrefix(line, "memcgate_async_writes_failed_total{") && !strings.HasSuffix(strings.TrimSpace(line), " 0") {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

// accessStatus is the status of the access log line of request id.
func accessStatus(t *testing.T, r *rig, id string) (int, bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		sc := bufio.NewScanner(strings.NewReader(r.g.Logs()))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if !bytes.Contains(sc.Bytes(), []byte(`"request_id":"`+id+`"`)) || !bytes.Contains(sc.Bytes(), []byte(`"msg":"request"`)) {
				continue
			}
			var line struct {
				Status int `json:"status"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil {
				return line.Status, true
			}
		}
		if time.Now().After(deadline) {
			return 0, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func shorten(s string) string {
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}
