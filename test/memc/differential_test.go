package memc_test

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// env is the running setup: the reference and one memcgate per reference
// location (each location's settings differ), with their own memcached.
type env struct {
	nginx  string            // the reference, every location
	gates  map[string]string // location ("/memc", "/lm", "/ro", "/down", "slow") → memcgate
	refMC  *memcachedtest.Server
	gateMC *memcachedtest.Server
	slowMC *memcachedtest.Server // paused for the timeout row
	marks  map[string]time.Time
}

// expect is what one side must answer.
type expect struct {
	status      int
	contentType string  // "" = not checked
	body        *string // nil = not checked
}

// difference is an intended difference: each side is held to its own
// expectation and the two answers are not compared. name is how
// docs/migrating-from-nginx-memc.md lists it.
type difference struct {
	name      string
	ref, gate expect
}

// step is one request case. By default the request goes to both sides,
// both must answer the documented status (and body and headers, when
// given), and the answers must agree: status, Content-Type, and for bodies
// the module writes itself (not text/html error pages) the body byte for
// byte, Content-Length, X-Memc-Flags and Last-Modified.
type step struct {
	name   string
	req    request
	status int               // documented status, required of both sides
	body   *string           // documented body, required of both sides
	hdr    map[string]string // documented headers, required of both sides ("" = absent)
	stats  bool              // compare as stats replies: the same STAT names in order, one END
	diff   *difference       // an intended difference (see difference)
	// only names why the reference cannot show this row; the request goes
	// to memcgate instance gate alone and must answer status.
	only string
	gate string // memcgate instance for only rows
	// before and after run around the request (faults, side checks).
	before, after func(t *testing.T, e *env)
	// mark records the time after the step under its name; waitFor waits
	// until wait has passed since that mark before the step (expiry is
	// memcached's clock, nothing to poll).
	mark, waitFor string
	wait          time.Duration
}

func ptr(s string) *string { return &s }

func get(target string) request  { return request{method: "GET", target: target} }
func head(target string) request { return request{method: "HEAD", target: target} }
func put(target string, body string) request {
	return request{method: "PUT", target: target, body: []byte(body)}
}
func chunked(method, target string, chunks ...string) request {
	rq := request{method: method, target: target, chunked: true}
	for _, c := range chunks {
		rq.chunks = append(rq.chunks, []byte(c))
	}
	return rq
}

const (
	stored    = "STORED\r\n"
	notStored = "NOT_STORED\r\n"
	deleted   = "DELETED\r\n"
	ok        = "OK\r\n"
	version   = "VERSION 1.6.18\r\n"
	badLine   = "CLIENT_ERROR bad command line format\r\n"
	badDelete = "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"
	nonNumber = "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
	tooLarge  = "SERVER_ERROR object too large for cache\r\n"
)

// The table. Rows follow docs §1-§6 of the behaviour reference
// (docs/migrating-from-nginx-memc.md summarises it); state carries from
// row to row on both sides alike.
func steps() []step {
	k := strings.Repeat
	big := func(n int) []byte { return bytes.Repeat([]byte{'v'}, n) }
	binaryValue := "\x00\r\nEND\r\nVALUE x 0 1\r\n\xff\xfe"
	return []step{
		// §3 flush_all, then §1 default commands from the method.
		{name: "flush_all", req: get("/memc?cmd=flush_all"), status: 200, body: ptr(ok)},
		{name: "PUT is set", req: get("/memc?cmd=set&key=m1&val=v1").with("PUT"), status: 201, body: ptr(stored), hdr: map[string]string{"X-Memc-Flags": "0"}},
		{name: "GET is get", req: get("/memc?key=m1"), status: 200, body: ptr("v1"), hdr: map[string]string{"X-Memc-Flags": "0", "Content-Type": "text/plain", "ETag": "", "Accept-Ranges": "", "Last-Modified": ""}},
		{name: "HEAD is get, exact Content-Length", req: head("/memc?key=m1"), status: 200, body: ptr("")},
		{name: "POST is add, not set (key exists)", req: request{method: "POST", target: "/memc?key=m1&val=v2"}, status: 200, body: ptr(notStored)},
		{name: "POST is add (new key)", req: request{method: "POST", target: "/memc?key=m2&val=v2"}, status: 201, body: ptr(stored)},
		{name: "DELETE is delete", req: request{method: "DELETE", target: "/memc?key=m2"}, status: 200, body: ptr(deleted), hdr: map[string]string{"X-Memc-Flags": ""}},
		{name: "delete of a missing key is 404", req: request{method: "DELETE", target: "/memc?key=m2"}, status: 404},
		{name: "OPTIONS has no default command", req: request{method: "OPTIONS", target: "/memc?key=m1"}, status: 400},
		{name: "PATCH has no default command", req: request{method: "PATCH", target: "/memc?key=m1"}, status: 400},
		{name: "an unregistered method has no default command", req: request{method: "PURGE", target: "/memc?key=m1"}, status: 400},
		{name: "cmd wins over the method", req: request{method: "DELETE", target: "/memc?cmd=get&key=m1"}, status: 200, body: ptr("v1")},
		{name: "an empty cmd falls back to the method", req: request{method: "DELETE", target: "/memc?cmd=&key=m1"}, status: 200, body: ptr(deleted)},
		{name: "get miss is 404", req: get("/memc?key=m1"), status: 404, hdr: map[string]string{"Content-Type": "text/html", "X-Memc-Flags": ""}},
		{name: "HEAD miss is 404", req: head("/memc?key=m1"), status: 404},

		// §1 command names: exact and case-sensitive.
		{name: "cas is unknown", req: get("/memc?cmd=cas&key=m1&val=1"), status: 400},
		{name: "gets is unknown", req: get("/memc?cmd=gets&key=m1"), status: 400},
		{name: "touch is unknown", req: get("/memc?cmd=touch&key=m1&exptime=1"), status: 400},
		{name: "gat is unknown", req: get("/memc?cmd=gat&key=m1"), status: 400},
		{name: "verbosity is unknown", req: get("/memc?cmd=verbosity&val=1"), status: 400},
		{name: "quit is unknown", req: get("/memc?cmd=quit"), status: 400},
		{name: "GET is not get", req: get("/memc?cmd=GET&key=m1"), status: 400},
		{name: "Set is not set", req: get("/memc?cmd=Set&key=m1&val=1"), status: 400},
		{name: "cmd is not URL-decoded (flush%5Fall)", req: get("/memc?cmd=flush%5Fall"), status: 400},

		// §1 memc_cmds_allowed get version stats (/ro) and its place in the order.
		{name: "ro: set is forbidden", req: get("/ro?cmd=set&key=r1&val=1"), status: 403},
		{name: "ro: PUT's default set is forbidden", req: put("/ro?key=r1", "x"), status: 403},
		{name: "ro: unknown command is 400 before 403", req: get("/ro?cmd=bogus&key=r1"), status: 400},
		{name: "ro: forbidden wins over a missing key", req: get("/ro?cmd=delete"), status: 403},
		{name: "ro: flush_all is forbidden", req: get("/ro?cmd=flush_all"), status: 403},
		{name: "ro: version is allowed", req: get("/ro?cmd=version"), status: 200, body: ptr(version)},
		{name: "ro: stats is allowed", req: get("/ro?cmd=stats"), status: 200, stats: true},
		{name: "ro: set up an item", req: get("/memc?cmd=set&key=r1&val=ro&flags=3"), status: 201},
		{name: "ro: get is allowed (no flags header there)", req: get("/ro?key=r1&flags=9"), status: 200, body: ptr("ro"), hdr: map[string]string{"X-Memc-Flags": ""}},

		// §1 checks 3-5: digit-only exptime, flags, delta, and where they apply.
		{name: "bad exptime is 400 before a missing key", req: get("/memc?cmd=set&val=1&exptime=abc"), status: 400},
		{name: "exptime of 11 digits", req: get("/memc?cmd=set&key=c1&val=1&exptime=12345678901"), status: 400},
		{name: "negative exptime", req: get("/memc?cmd=set&key=c1&val=1&exptime=-1"), status: 400},
		{name: "bad exptime on delete", req: get("/memc?cmd=delete&key=c1&exptime=x"), status: 400},
		{name: "bad exptime on flush_all", req: get("/memc?cmd=flush_all&exptime=x"), status: 400},
		{name: "exptime is not checked for get", req: get("/memc?key=r1&exptime=abc"), status: 200, body: ptr("ro")},
		{name: "bad flags is 400 before a missing key", req: get("/memc?cmd=set&val=1&flags=x"), status: 400},
		{name: "flags with a sign", req: get("/memc?cmd=set&key=c1&val=1&flags=+1"), status: 400},
		{name: "negative flags", req: get("/memc?cmd=set&key=c1&val=1&flags=-1"), status: 400},
		{name: "flags of 11 digits", req: get("/memc?cmd=set&key=c1&val=1&flags=12345678901"), status: 400},
		{name: "flags are not checked for get (header is the item's)", req: get("/memc?key=r1&flags=abc"), status: 200, body: ptr("ro"), hdr: map[string]string{"X-Memc-Flags": "3"}},
		{name: "flags are not checked for delete", req: get("/memc?cmd=delete&key=c9&flags=abc"), status: 404},
		{name: "incr needs a value", req: get("/memc?cmd=incr&key=n1"), status: 400},
		{name: "incr with an empty value", req: get("/memc?cmd=incr&key=n1&val="), status: 400},
		{name: "incr delta -5", req: get("/memc?cmd=incr&key=n1&val=-5"), status: 400},
		{name: "incr delta nice", req: get("/memc?cmd=incr&key=n1&val=nice"), status: 400},
		{name: "incr delta of 20 digits", req: get("/memc?cmd=incr&key=n1&val=00000000000000000001"), status: 400},
		{name: "decr bad delta is 400 before a missing key", req: get("/memc?cmd=decr&val=x"), status: 400},

		// §1 checks 6-7: body size, key, value; all before any connection.
		{name: "declared body over 1m is 413 before everything", req: request{method: "GET", target: "/memc?cmd=bogus", body: big(1<<20 + 1)}, status: 413},
		{name: "chunked body over 1m: unknown command is 400 first", req: request{method: "GET", target: "/memc?cmd=bogus", chunked: true, chunks: [][]byte{big(600000), big(600000)}}, status: 400},
		{name: "chunked body over 1m is 413 for get", req: request{method: "GET", target: "/memc?key=r1", chunked: true, chunks: [][]byte{big(600000), big(600000)}}, status: 413},
		{name: "chunked body over 1m is 413 before a missing key", req: request{method: "PUT", target: "/memc?cmd=set", chunked: true, chunks: [][]byte{big(600000), big(600000)}}, status: 413},
		{name: "set without key is 500", req: get("/memc?cmd=set&val=1"), status: 500},
		{name: "get without key is 500", req: get("/memc"), status: 500},
		{name: "empty key is 500", req: get("/memc?key="), status: 500},
		{name: "delete without key is 500", req: get("/memc?cmd=delete"), status: 500},
		{name: "incr without key is 500", req: get("/memc?cmd=incr&val=1"), status: 500},
		{name: "path style: PUT without a body is 500", req: request{method: "PUT", target: "/key/nobody"}, status: 500},
		{name: "path style: POST without a body is 500", req: request{method: "POST", target: "/key/nobody"}, status: 500},
		{name: "down: missing key is 500, not 502", req: get("/down?cmd=set&val=1"), status: 500},
		{name: "down: unknown command is 400, not 502", req: get("/down?cmd=bogus&key=x"), status: 400},

		// §1 ranges are memcached's: flags modulo 2^32, exptime truncated to 32 bits.
		{name: "flags 4294967297 are echoed as sent", req: get("/memc?cmd=set&key=f1&val=1&flags=4294967297"), status: 201, hdr: map[string]string{"X-Memc-Flags": "4294967297"}},
		{name: "flags 4294967297 read back as 1", req: get("/memc?key=f1"), status: 200, hdr: map[string]string{"X-Memc-Flags": "1"}},
		{name: "flags 0000000007 are echoed as sent", req: get("/memc?cmd=set&key=f2&val=1&flags=0000000007"), status: 201, hdr: map[string]string{"X-Memc-Flags": "0000000007"}},
		{name: "flags 0000000007 read back as 7", req: get("/memc?key=f2"), status: 200, hdr: map[string]string{"X-Memc-Flags": "7"}},
		{name: "flags 9999999999", req: get("/memc?cmd=set&key=f3&val=1&flags=9999999999"), status: 201},
		{name: "flags 9999999999 read back modulo 2^32", req: get("/memc?key=f3"), status: 200, hdr: map[string]string{"X-Memc-Flags": "1410065407"}},
		{name: "exptime 4294967295 is stored", req: get("/memc?cmd=set&key=e1&val=1&exptime=4294967295"), status: 201},
		{name: "exptime 4294967295 wraps negative: expired", req: get("/memc?key=e1"), status: 404},
		{name: "exptime 2147483648", req: get("/memc?cmd=set&key=e2&val=1&exptime=2147483648"), status: 201},
		{name: "exptime 2147483648 wraps negative: expired", req: get("/memc?key=e2"), status: 404},
		{name: "exptime 2147483647", req: get("/memc?cmd=set&key=e3&val=1&exptime=2147483647"), status: 201},
		{name: "exptime 2147483647 works", req: get("/memc?key=e3"), status: 200},
		{name: "exptime 4294967296", req: get("/memc?cmd=set&key=e4&val=1&exptime=4294967296"), status: 201},
		{name: "exptime 4294967296 wraps to 0: never expires", req: get("/memc?key=e4"), status: 200},
		{name: "expiry: exptime 1", req: get("/memc?cmd=set&key=ex1&val=1&exptime=1"), status: 201, mark: "ex1"},
		{name: "expiry: exptime 0000000100", req: get("/memc?cmd=set&key=ex2&val=1&exptime=0000000100"), status: 201},

		// §2/§3 every command's reply.
		{name: "set", req: get("/memc?cmd=set&key=s1&val=one"), status: 201, body: ptr(stored)},
		{name: "add of an existing key", req: get("/memc?cmd=add&key=s1&val=x"), status: 200, body: ptr(notStored), hdr: map[string]string{"X-Memc-Flags": "0"}},
		{name: "replace of a missing key", req: get("/memc?cmd=replace&key=s2&val=x"), status: 200, body: ptr(notStored)},
		{name: "append to a missing key", req: get("/memc?cmd=append&key=s2&val=x"), status: 200, body: ptr(notStored)},
		{name: "prepend to a missing key", req: get("/memc?cmd=prepend&key=s2&val=x"), status: 200, body: ptr(notStored)},
		{name: "replace", req: get("/memc?cmd=replace&key=s1&val=two&flags=5"), status: 201, body: ptr(stored), hdr: map[string]string{"X-Memc-Flags": "5"}},
		{name: "append (its flags are ignored by memcached)", req: get("/memc?cmd=append&key=s1&val=-end&flags=9"), status: 201, body: ptr(stored), hdr: map[string]string{"X-Memc-Flags": "9"}},
		{name: "prepend", req: get("/memc?cmd=prepend&key=s1&val=start-"), status: 201, body: ptr(stored)},
		{name: "get after append and prepend", req: get("/memc?key=s1"), status: 200, body: ptr("start-two-end"), hdr: map[string]string{"X-Memc-Flags": "5"}},
		{name: "delete with exptime 0 is accepted", req: get("/memc?cmd=delete&key=s1&exptime=0"), status: 200, body: ptr(deleted)},
		{name: "set d1", req: get("/memc?cmd=set&key=d1&val=1"), status: 201},
		{name: "delete with exptime 5: memcached's usage error", req: get("/memc?cmd=delete&key=d1&exptime=5"), status: 502, body: ptr(badDelete), hdr: map[string]string{"Content-Type": "text/plain"}},
		{name: "delete with exptime 00: memcached's usage error", req: get("/memc?cmd=delete&key=d1&exptime=00"), status: 502, body: ptr(badDelete)},
		{name: "the item survived the refused deletes", req: get("/memc?key=d1"), status: 200, body: ptr("1")},
		{name: "delete with flags echoes them", req: get("/memc?cmd=delete&key=d1&flags=12"), status: 200, body: ptr(deleted), hdr: map[string]string{"X-Memc-Flags": "12"}},
		{name: "version", req: get("/memc?cmd=version"), status: 200, body: ptr(version), hdr: map[string]string{"X-Memc-Flags": ""}},
		{name: "version echoes the flags argument", req: get("/memc?cmd=version&flags=5"), status: 200, body: ptr(version), hdr: map[string]string{"X-Memc-Flags": "5"}},
		{name: "stats", req: get("/memc?cmd=stats"), status: 200, stats: true},

		// §3 incr/decr: 201 with the number; memcached's side effects show.
		{name: "set n1 10", req: get("/memc?cmd=set&key=n1&val=10"), status: 201},
		{name: "incr", req: get("/memc?cmd=incr&key=n1&val=5"), status: 201, body: ptr("15\r\n"), hdr: map[string]string{"X-Memc-Flags": ""}},
		{name: "decr that shortens the number", req: get("/memc?cmd=decr&key=n1&val=6&flags=zz"), status: 201, body: ptr("9\r\n"), hdr: map[string]string{"X-Memc-Flags": "zz"}},
		{name: "decr left the value space-padded", req: get("/memc?key=n1"), status: 200, body: ptr("9 ")},
		{name: "incr with 19 digits and leading zeros", req: get("/memc?cmd=incr&key=n1&val=0000000000000000001"), status: 201, body: ptr("10\r\n")},
		{name: "incr ignores a bad exptime", req: get("/memc?cmd=incr&key=n1&val=1&exptime=abc"), status: 201, body: ptr("11\r\n")},
		{name: "incr of a missing key", req: get("/memc?cmd=incr&key=n9&val=1"), status: 404},
		{name: "decr of a missing key", req: get("/memc?cmd=decr&key=n9&val=1"), status: 404},
		{name: "set w1 2^64-1", req: get("/memc?cmd=set&key=w1&val=18446744073709551615"), status: 201},
		{name: "incr wraps at 2^64", req: get("/memc?cmd=incr&key=w1&val=1"), status: 201, body: ptr("0\r\n")},
		{name: "set z1 5", req: get("/memc?cmd=set&key=z1&val=5"), status: 201},
		{name: "decr stops at 0", req: get("/memc?cmd=decr&key=z1&val=10"), status: 201, body: ptr("0\r\n")},
		{name: "set t1 text", req: get("/memc?cmd=set&key=t1&val=abc"), status: 201},
		{name: "incr of text: memcached's error line", req: get("/memc?cmd=incr&key=t1&val=1"), status: 502, body: ptr(nonNumber), hdr: map[string]string{"Content-Type": "text/plain"}},
		{name: "decr of text: memcached's error line", req: get("/memc?cmd=decr&key=t1&val=1"), status: 502, body: ptr(nonNumber)},
		{name: "HEAD incr increments", req: head("/memc?cmd=incr&key=z1&val=7"), status: 201, body: ptr("")},
		{name: "after HEAD incr", req: get("/memc?key=z1"), status: 200, body: ptr("7")},

		// §2 keys: escaping and the 250-byte limit after it.
		{name: "key of 250 bytes", req: get("/memc?cmd=set&key=" + k("a", 250) + "&val=250"), status: 201},
		{name: "get key of 250 bytes", req: get("/memc?key=" + k("a", 250)), status: 200, body: ptr("250")},
		{name: "set key of 251 bytes", req: get("/memc?cmd=set&key=" + k("a", 251) + "&val=1"), status: 502, body: ptr(badLine), hdr: map[string]string{"Content-Type": "text/plain"}},
		{name: "get key of 251 bytes: nginx page", req: get("/memc?key=" + k("a", 251)), status: 502, hdr: map[string]string{"Content-Type": "text/html"}},
		{name: "delete key of 251 bytes", req: get("/memc?cmd=delete&key=" + k("a", 251)), status: 502, body: ptr(badLine)},
		{name: "delete key of 251 bytes with exptime: usage error first", req: get("/memc?cmd=delete&exptime=5&key=" + k("a", 251)), status: 502, body: ptr(badDelete)},
		{name: "incr key of 251 bytes", req: get("/memc?cmd=incr&val=1&key=" + k("a", 251)), status: 502, body: ptr(badLine)},
		{name: "append key of 251 bytes", req: get("/memc?cmd=append&val=1&key=" + k("a", 251)), status: 502, body: ptr(badLine)},
		{name: "245 bytes + %20 escape to 250", req: get("/memc?cmd=set&key=" + k("b", 245) + "%20&val=1"), status: 201},
		{name: "get 245 bytes + %20", req: get("/memc?key=" + k("b", 245) + "%20"), status: 200, body: ptr("1")},
		{name: "246 bytes + %20 (249 raw) escape to 251", req: get("/memc?cmd=set&key=" + k("b", 246) + "%20&val=1"), status: 502, body: ptr(badLine)},
		{name: "247 bytes + % escape to 250", req: get("/memc?cmd=set&key=" + k("c", 247) + "%&val=1"), status: 201},
		{name: "125 two-byte characters are 250 bytes", req: get("/memc?cmd=set&key=" + k("ä", 125) + "&val=1"), status: 201},
		{name: "126 two-byte characters are 252 bytes", req: get("/memc?cmd=set&key=" + k("ä", 126) + "&val=1"), status: 502, body: ptr(badLine)},
		{name: "path style: key of 251 bytes", req: put("/key/"+k("a", 251), "1"), status: 502, body: ptr(badLine)},

		// §2 values: binary, empty, chunked; §3 the size limit.
		{name: "binary value (NUL, CRLF, END, 0xFF)", req: put("/key/bin", binaryValue), status: 201, body: ptr(stored)},
		{name: "binary value reads back", req: get("/key/bin"), status: 200, body: ptr(binaryValue)},
		{name: "chunked value", req: chunked("PUT", "/key/chunk", "hello ", "chunked ", "world"), status: 201, body: ptr(stored)},
		{name: "chunked value reads back", req: get("/key/chunk"), status: 200, body: ptr("hello chunked world")},
		{name: "empty chunked body stores an empty value", req: chunked("PUT", "/key/chunk0"), status: 201, body: ptr(stored)},
		{name: "empty chunked value reads back", req: get("/key/chunk0"), status: 200, body: ptr("")},
		{name: "Content-Length 0 stores an empty value", req: put("/key/empty", ""), status: 201, body: ptr(stored)},
		{name: "empty value reads back", req: get("/key/empty"), status: 200, body: ptr("")},
		{name: "HEAD of an empty value", req: head("/key/empty"), status: 200, body: ptr("")},
		{name: "raw UTF-8 and high bytes in val", req: get("/memc?cmd=set&key=hb&val=\xc3\xa4\xff\xfe"), status: 201},
		{name: "high bytes read back", req: get("/memc?key=hb"), status: 200, body: ptr("\xc3\xa4\xff\xfe")},
		{name: "value of 1,048,500 bytes is stored", req: request{method: "PUT", target: "/key/big", body: big(1048500)}, status: 201, body: ptr(stored)},
		{name: "value of 1,048,500 bytes reads back", req: get("/key/big"), status: 200},
		{name: "value of 1,048,520 bytes: memcached refuses", req: request{method: "PUT", target: "/key/big", body: big(1048520)}, status: 502, body: ptr(tooLarge)},
		{name: "a too-large set deleted the item", req: get("/key/big"), status: 404},
		{name: "set big2", req: put("/key/big2", "keep"), status: 201},
		{name: "a too-large add", req: request{method: "POST", target: "/key/big2", body: big(1048520)}, status: 502, body: ptr(tooLarge)},
		{name: "a too-large add left the item", req: get("/key/big2"), status: 200, body: ptr("keep")},
		{name: "a too-large append", req: request{method: "PUT", target: "/key/big2?cmd=append", body: big(1048520)}, status: 502, body: ptr(tooLarge)},
		{name: "a too-large append left the item", req: get("/key/big2"), status: 200, body: ptr("keep")},
		{name: "body of exactly 1m passes nginx, not memcached", req: request{method: "PUT", target: "/key/big3", body: big(1 << 20)}, status: 502, body: ptr(tooLarge)},
		{name: "declared body of 1m + 1 is 413", req: request{method: "PUT", target: "/key/big3", body: big(1<<20 + 1)}, status: 413},
		{name: "chunked body of 1m + 1 is 413", req: request{method: "PUT", target: "/key/big3", chunked: true, chunks: [][]byte{big(1 << 19), big(1<<19 + 1)}}, status: 413},

		// §5 HEAD with writes, flags headers, Last-Modified (/lm).
		{name: "HEAD set stores", req: head("/memc?cmd=set&key=h1&val=abc"), status: 201, body: ptr("")},
		{name: "after HEAD set", req: get("/memc?key=h1"), status: 200, body: ptr("abc")},
		{name: "HEAD of a storage error", req: head("/memc?cmd=set&key=" + k("a", 251) + "&val=1"), status: 502, body: ptr("")},
		{name: "lm: set with a time as flags", req: get("/lm?cmd=set&key=lm1&val=v&flags=1264680563"), status: 201, body: ptr(stored), hdr: map[string]string{"Last-Modified": "", "X-Memc-Flags": "1264680563"}},
		{name: "lm: get hit has Last-Modified", req: get("/lm?key=lm1"), status: 200, body: ptr("v"), hdr: map[string]string{"Last-Modified": "Thu, 28 Jan 2010 12:09:23 GMT", "X-Memc-Flags": "1264680563"}},
		{name: "lm: If-Modified-Since never yields 304", req: request{method: "GET", target: "/lm?key=lm1", hdr: []string{"If-Modified-Since: Thu, 28 Jan 2010 12:09:23 GMT"}}, status: 200, body: ptr("v")},
		{name: "lm: If-Unmodified-Since never yields 412", req: request{method: "GET", target: "/lm?key=lm1", hdr: []string{"If-Unmodified-Since: Thu, 01 Jan 2009 00:00:00 GMT"}}, status: 200, body: ptr("v")},
		{name: "Range is ignored", req: request{method: "GET", target: "/memc?key=h1", hdr: []string{"Range: bytes=0-0"}}, status: 200, body: ptr("abc"), hdr: map[string]string{"Content-Range": "", "Accept-Ranges": ""}},
		{name: "lm: flags 0 is the epoch", req: get("/lm?key=m2&cmd=set&val=0"), status: 201},
		{name: "lm: get flags 0", req: get("/lm?key=m2"), status: 200, hdr: map[string]string{"Last-Modified": "Thu, 01 Jan 1970 00:00:00 GMT"}},
		{name: "lm: HEAD hit", req: head("/lm?key=lm1"), status: 200, hdr: map[string]string{"Last-Modified": "Thu, 28 Jan 2010 12:09:23 GMT"}},
		{name: "lm: miss has no Last-Modified", req: get("/lm?key=lm9"), status: 404, hdr: map[string]string{"Last-Modified": ""}},

		// §6 how arguments are read.
		{name: "val is not URL-decoded", req: get("/memc?cmd=set&key=q1&val=hello%20world+x"), status: 201},
		{name: "val reads back raw", req: get("/memc?key=q1"), status: 200, body: ptr("hello%20world+x")},
		{name: "names are case-insensitive", req: get("/memc?CMD=set&Key=q2&VAL=mixed&FLAGS=4"), status: 201, hdr: map[string]string{"X-Memc-Flags": "4"}},
		{name: "case-insensitive names read back", req: get("/memc?kEy=q2"), status: 200, body: ptr("mixed")},
		{name: "first occurrence wins", req: get("/memc?cmd=set&key=q3&val=first&cmd=delete&val=second&key=q4"), status: 201},
		{name: "first occurrence: q3 has the first value", req: get("/memc?key=q3"), status: 200, body: ptr("first")},
		{name: "first occurrence: q4 was never set", req: get("/memc?key=q4"), status: 404},
		{name: "an argument without = does not count", req: get("/memc?key&key=q3"), status: 200, body: ptr("first")},
		{name: "only & separates arguments", req: get("/memc?key=q3;cmd=delete"), status: 404},
		{name: "a name must start an argument", req: get("/memc?xkey=q4&key=q3"), status: 200, body: ptr("first")},
		{name: "val is defined when absent: POST body ignored", req: request{method: "POST", target: "/memc?key=q5", body: []byte("body")}, status: 201},
		{name: "POST stored an empty value", req: get("/memc?key=q5"), status: 200, body: ptr("")},
		{name: "PUT body ignored too", req: request{method: "PUT", target: "/memc?key=q5&flags=2", body: []byte("body")}, status: 201},
		{name: "PUT stored an empty value", req: get("/memc?key=q5"), status: 200, body: ptr(""), hdr: map[string]string{"X-Memc-Flags": "2"}},
		{name: "a fragment ends the query", req: get("/memc?cmd=set&key=q6#&val=frag"), status: 201},
		{name: "the fragment's val was not read", req: get("/memc?key=q6"), status: 200, body: ptr("")},

		// §6 path style.
		{name: "path: PUT is set", req: put("/key/p1?flags=6", "pv"), status: 201, body: ptr(stored), hdr: map[string]string{"X-Memc-Flags": "6"}},
		{name: "path: GET is get", req: get("/key/p1"), status: 200, body: ptr("pv"), hdr: map[string]string{"X-Memc-Flags": "6"}},
		{name: "path: POST is add", req: request{method: "POST", target: "/key/p1", body: []byte("x")}, status: 200, body: ptr(notStored)},
		{name: "path: ?cmd=append", req: request{method: "POST", target: "/key/p1?cmd=append", body: []byte("+")}, status: 201},
		{name: "path: appended", req: get("/key/p1"), status: 200, body: ptr("pv+")},
		{name: "path: incr has no value source", req: get("/key/p1?cmd=incr&val=1"), status: 400},
		{name: "path: a body on get is ignored", req: request{method: "GET", target: "/key/p1", body: []byte("ignored")}, status: 200, body: ptr("pv+")},
		{name: "path: DELETE is delete", req: request{method: "DELETE", target: "/key/p1"}, status: 200, body: ptr(deleted)},
		{name: "path: version", req: get("/key/p1?cmd=version"), status: 200, body: ptr(version)},
		{name: "path: bad exptime", req: put("/key/p1?exptime=x", "1"), status: 400},
		{name: "path: /key/ alone matches no location", req: get("/key/"), status: 404, hdr: map[string]string{"Content-Type": "text/html"}},
		{name: "path: /key/x/.. normalises to /key/", req: get("/key/x/.."), status: 404},
		{name: "path: /key/.. normalises out of the location", req: get("/key/.."), status: 404},
		{name: "path: .. above the root", req: put("/key/../../x", "1"), status: 400},
		{name: "path: %00", req: put("/key/a%00b", "1"), status: 400},
		{name: "path: newline inside the key matches no location", req: put("/key/a%0Ab", "1"), status: 404},
		{name: "path: %20 is a space", req: put("/key/a%20b", "sp"), status: 201},
		{name: "path: /key/a%20b is ?key=a%20b", req: get("/memc?key=a%20b"), status: 200, body: ptr("sp")},
		{name: "path: %C3%A4", req: put("/key/%C3%A4", "ae"), status: 201},
		{name: "path: /key/%C3%A4 is ?key=%C3%A4", req: get("/memc?key=%C3%A4"), status: 200, body: ptr("ae")},
		{name: "path: raw UTF-8", req: put("/key/\xc3\xb6", "oe"), status: 201},
		{name: "path: raw UTF-8 is the same in the query", req: get("/memc?key=\xc3\xb6"), status: 200, body: ptr("oe")},
		{name: "path: a+b", req: put("/key/a+b", "plus"), status: 201},
		{name: "path: /key/a+b is ?key=a%2Bb", req: get("/memc?key=a%2Bb"), status: 200, body: ptr("plus")},
		{name: "path: /key/a+b is not ?key=a+b", req: get("/memc?key=a+b"), status: 404},
		{name: "path: x%2Fy", req: put("/key/x%2Fy", "slash"), status: 201},
		{name: "path: /key/x%2Fy is /key/x//y", req: get("/key/x//y"), status: 200, body: ptr("slash")},
		{name: "path: /key/x%2Fy is ?key=x/y", req: get("/memc?key=x/y"), status: 200, body: ptr("slash")},
		{name: "path: /key/a%2520b is another item", req: get("/key/a%2520b"), status: 404},
		{name: "path: dot segments resolve", req: get("/key/q/./r/../../x%2F.%2Fy"), status: 200, body: ptr("slash")},

		// §4 memcached down (/down: a port with nothing on it).
		{name: "down: get is 502", req: get("/down?key=x"), status: 502, hdr: map[string]string{"Content-Type": "text/html"}},
		{name: "down: set is 502", req: get("/down?cmd=set&key=x&val=1"), status: 502},
		{name: "down: set with an empty val is still sent", req: get("/down?cmd=set&key=x"), status: 502},
		{name: "down: version is 502", req: get("/down?cmd=version"), status: 502},
		{name: "down: stats is 502", req: get("/down?cmd=stats"), status: 502},
		{name: "down: flush_all is 502", req: get("/down?cmd=flush_all"), status: 502},

		// §4 timeouts: the reference's memc timeouts are 60 s and cannot be
		// shortened without changing its configuration.
		{name: "memcached does not answer: 504", req: get("/memc?key=x"), status: 504, gate: "slow", hdr: map[string]string{"Content-Type": "text/html"},
			only:   "the reference's memc_*_timeout are 60 s; memcgate here has MEMCGATE_TIMEOUT=200ms against a paused memcached",
			before: func(t *testing.T, e *env) { e.slowMC.Pause() }, after: func(t *testing.T, e *env) { e.slowMC.Resume() }},

		// §4 requests nginx core refuses.
		{name: "control byte in the request line", req: get("/memc?cmd=set&key=a\x01b&val=1"), diff: &difference{
			name: "request-line errors come from Go's net/http",
			ref:  expect{status: 400, contentType: "text/html"}, gate: expect{status: 400, contentType: "text/plain; charset=utf-8"}}},
		{name: "DEL in the request line", req: get("/memc?cmd=set&key=a\x7fb&val=1"), diff: &difference{
			name: "request-line errors come from Go's net/http",
			ref:  expect{status: 400, contentType: "text/html"}, gate: expect{status: 400, contentType: "text/plain; charset=utf-8"}}},
		{name: "bad %-escape in the path", req: put("/key/x%zz", "1"), diff: &difference{
			name: "request-line errors come from Go's net/http",
			ref:  expect{status: 400, contentType: "text/html"}, gate: expect{status: 400, contentType: "text/plain; charset=utf-8"}}},

		// §4 which answers close the client connection (nginx core: 400, 413, 500).
		{name: "keep-alive: 200 keeps the connection", req: request{method: "GET", target: "/memc?cmd=version", keepAlive: true}, status: 200},
		{name: "keep-alive: 404 keeps the connection", req: request{method: "GET", target: "/memc?key=nope", keepAlive: true}, status: 404},
		{name: "keep-alive: raw 502 keeps the connection", req: request{method: "GET", target: "/memc?cmd=incr&key=t1&val=1", keepAlive: true}, status: 502},
		{name: "keep-alive: 403 keeps the connection", req: request{method: "GET", target: "/ro?cmd=set&key=x", keepAlive: true}, status: 403},
		{name: "keep-alive: 400 closes", req: request{method: "GET", target: "/memc?cmd=nope", keepAlive: true}, status: 400},
		{name: "keep-alive: 413 closes", req: request{method: "PUT", target: "/key/k413", body: big(1<<20 + 1), keepAlive: true}, status: 413},
		{name: "keep-alive: 500 closes", req: request{method: "GET", target: "/memc?cmd=get", keepAlive: true}, status: 500},

		// §7 expiry (memcached's clock: exptime 1, checked 2 s later).
		{name: "expiry: exptime 1 expired", req: get("/memc?key=ex1"), status: 404, waitFor: "ex1", wait: 2100 * time.Millisecond},
		{name: "expiry: exptime 100 did not", req: get("/memc?key=ex2"), status: 200},

		// §8 the long-key defect: the reference runs the body as a command.
		{name: "injection: set the victim", req: get("/memc?cmd=set&key=victim&val=alive"), status: 201},
		{name: "injection: 251-byte key, body is a command", req: put("/key/"+k("i", 251), "delete victim"), status: 502, body: ptr(badLine)},
		{name: "injection: the victim", req: get("/memc?key=victim"), diff: &difference{
			name: "a key over 250 bytes is never sent (the module's injection defect)",
			ref:  expect{status: 404, contentType: "text/html"}, gate: expect{status: 200, contentType: "text/plain", body: ptr("alive")}}},
		{name: "injection: set in the body", req: put("/key/"+k("i", 251), "set planted 0 0 1\r\nX"), status: 502, body: ptr(badLine)},
		{name: "injection: the planted item", req: get("/memc?key=planted"), diff: &difference{
			name: "a key over 250 bytes is never sent (the module's injection defect)",
			ref:  expect{status: 200, contentType: "text/plain", body: ptr("X")}, gate: expect{status: 404, contentType: "text/html"}}},

		// §2 key escaping as stored: both memcacheds must hold the same keys.
		{name: "keys: flush_all", req: get("/memc?cmd=flush_all&exptime=00"), status: 200, body: ptr(ok)},
		{name: "keys: space, %, control bytes", req: get("/memc?cmd=set&key=a%20b%25c%01d%7Fe%00f&val=1"), status: 201},
		{name: "keys: raw UTF-8 and /", req: get("/memc?cmd=set&key=\xc3\xa4/\xe2\x82\xac&val=1"), status: 201},
		{name: "keys: printable ASCII", req: get("/memc?cmd=set&key=!\"$'()*,-.:<=>@[\\]^_`{|}~&val=1"), status: 201},
		{name: "keys: path %20", req: put("/key/s%20p", "1"), status: 201},
		{name: "keys: path +", req: put("/key/p+l", "1"), status: 201},
		{name: "keys: path printable without escapes", req: put("/key/q\"<>\\^`{|}&;=@!$'()*,:[]~", "1"), status: 201},
		{name: "keys: path printable with an escape", req: put("/key/r%21\"<>\\^`{|}&;=@!$'()*,:[]~", "1"), status: 201},
		{name: "keys: path escaped control, DEL, high bytes", req: put("/key/c%01%0D%1F%7F%80%FF", "1"), status: 201},
		{name: "keys: path escaped %, ?, #", req: put("/key/e%25%3F%23", "1"), status: 201},
		{name: "keys: path raw UTF-8", req: put("/key/u\xe2\x82\xac", "1"), status: 201},
		{name: "keys: path trailing newline dropped", req: put("/key/nl%0A", "1"), status: 201},
		{name: "keys: path slashes and dots", req: put("/key/d//e/./f/../g/", "1"), status: 201},
		{name: "keys: path escaped slashes", req: put("/key/h%2F%2Fi%2F.%2Fj", "1"), status: 201},
		{name: "keys: path escape in the query only", req: put("/key/w\"?x=%20", "1"), status: 201},
		{name: "keys: both memcacheds hold the same keys", req: get("/memc?cmd=version"), status: 200, after: sameKeys},

		// §3 flush_all with a delay: items go N seconds later.
		{name: "flush delay: set", req: get("/memc?cmd=set&key=fl1&val=1"), status: 201},
		{name: "flush_all with exptime 3", req: get("/memc?cmd=flush_all&exptime=3"), status: 200, body: ptr(ok), mark: "flush"},
		{name: "flush delay: still there at once", req: get("/memc?key=fl1"), status: 200, body: ptr("1")},
		{name: "flush delay: gone after 3 s", req: get("/memc?key=fl1"), status: 404, waitFor: "flush", wait: 3200 * time.Millisecond},
	}
}

func (rq request) with(method string) request { rq.method = method; return rq }

// sameKeys compares the keys both memcacheds hold.
func sameKeys(t *testing.T, e *env) {
	t.Helper()
	ref, err := memcachedKeys(e.refMC.Addr)
	if err != nil {
		t.Fatalf("reference memcached keys: %v", err)
	}
	gate, err := memcachedKeys(e.gateMC.Addr)
	if err != nil {
		t.Fatalf("memcgate's memcached keys: %v", err)
	}
	if !slices.Equal(ref, gate) {
		t.Errorf("memcached keys differ:\n reference %q\n memcgate  %q", ref, gate)
	}
	if len(ref) != 14 {
		t.Errorf("reference holds %d keys, want the 14 the steps set: %q", len(ref), ref)
	}
}

// gateFor is the memcgate instance that mirrors the location of target.
func (e *env) gateFor(s step) string {
	if s.gate != "" {
		return e.gates[s.gate]
	}
	path, _, _ := strings.Cut(s.req.target, "?")
	switch path {
	case "/lm", "/ro", "/down":
		return e.gates[path]
	}
	return e.gates["/memc"]
}

func TestDifferential(t *testing.T) {
	bin := needNginx(t)
	start := time.Now()
	e := &env{
		refMC:  memcachedtest.Start(t),
		gateMC: memcachedtest.Start(t),
		slowMC: memcachedtest.Start(t),
		marks:  map[string]time.Time{},
	}
	t.Cleanup(e.slowMC.Resume)
	deadPort := memcachedtest.DeadPort(t)
	e.nginx = startNginx(t, bin, e.refMC.Port, deadPort)
	common := map[string]string{"MEMCGATE_SERVERS": e.gateMC.Addr}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range common {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	e.gates = map[string]string{
		"/memc": startGate(t, with("MEMCGATE_MEMC_PATH", "/memc", "MEMCGATE_MEMC_KEY_PATH", "/key/", "MEMCGATE_MEMC_FLAGS_HEADER", "X-Memc-Flags"), true),
		"/lm":   startGate(t, with("MEMCGATE_MEMC_PATH", "/lm", "MEMCGATE_MEMC_FLAGS_TO_LAST_MODIFIED", "true", "MEMCGATE_MEMC_FLAGS_HEADER", "X-Memc-Flags"), true),
		"/ro":   startGate(t, with("MEMCGATE_MEMC_PATH", "/ro", "MEMCGATE_MEMC_CMDS_ALLOWED", "get version stats"), true),
		"/down": startGate(t, with("MEMCGATE_MEMC_PATH", "/down", "MEMCGATE_SERVERS", "127.0.0.1:"+strconv.Itoa(deadPort)), false),
		"slow": startGate(t, with("MEMCGATE_MEMC_PATH", "/memc", "MEMCGATE_SERVERS", e.slowMC.Addr,
			"MEMCGATE_TIMEOUT", "200ms", "MEMCGATE_REQUEST_TIMEOUT", "1s", "MEMCGATE_MAX_ATTEMPTS", "1"), true),
	}
	t.Logf("setup: %s", time.Since(start).Round(time.Millisecond))

	var compared, only int
	diffs := map[string]int{}
	all := steps()
	seen := map[string]bool{}
	for _, s := range all {
		if seen[s.name] {
			t.Fatalf("two steps are named %q", s.name)
		}
		seen[s.name] = true
		if s.waitFor != "" {
			at, ok := e.marks[s.waitFor]
			if !ok {
				t.Fatalf("%s: no mark %q", s.name, s.waitFor)
			}
			time.Sleep(time.Until(at.Add(s.wait)))
		}
		if s.before != nil {
			s.before(t, e)
		}
		switch {
		case s.only != "":
			only++
			gate, err := send(e.gateFor(s), s.req)
			if err != nil {
				t.Errorf("%s: memcgate: %v", s.name, err)
				break
			}
			if gate.status != s.status {
				t.Errorf("%s: memcgate answered %v, want status %d (memcgate only: %s)", s.name, gate, s.status, s.only)
			}
			for k, v := range s.hdr {
				if got := gate.header.Get(k); got != v {
					t.Errorf("%s: memcgate header %s = %q, want %q", s.name, k, got, v)
				}
			}
		default:
			ref, err1 := send(e.nginx, s.req)
			gate, err2 := send(e.gateFor(s), s.req)
			if err1 != nil || err2 != nil {
				t.Errorf("%s: reference: %v; memcgate: %v", s.name, err1, err2)
				break
			}
			if s.diff != nil {
				diffs[s.diff.name]++
				checkExpect(t, s.name+" (reference)", ref, s.diff.ref)
				checkExpect(t, s.name+" (memcgate, intended difference: "+s.diff.name+")", gate, s.diff.gate)
				break
			}
			compared++
			compare(t, s, ref, gate)
		}
		if s.after != nil {
			s.after(t, e)
		}
		if s.mark != "" {
			e.marks[s.mark] = time.Now()
		}
	}
	names := make([]string, 0, len(diffs))
	for n, c := range diffs {
		names = append(names, n+" ("+strconv.Itoa(c)+")")
	}
	slices.Sort(names)
	t.Logf("%d cases: %d compared equal, %d intended differences [%s], %d memcgate only; %s in all",
		len(all), compared, len(all)-compared-only, strings.Join(names, "; "), only, time.Since(start).Round(time.Millisecond))
}

// checkExpect holds one answer to an expectation.
func checkExpect(t *testing.T, what string, got response, want expect) {
	t.Helper()
	if got.status != want.status {
		t.Errorf("%s: status %d, want %d (%v)", what, got.status, want.status, got)
	}
	if want.contentType != "" && got.header.Get("Content-Type") != want.contentType {
		t.Errorf("%s: Content-Type %q, want %q", what, got.header.Get("Content-Type"), want.contentType)
	}
	if want.body != nil && string(got.body) != *want.body {
		t.Errorf("%s: body %q, want %q", what, got.body, *want.body)
	}
}

// compare holds both answers to the documented status, body and headers,
// then to each other.
func compare(t *testing.T, s step, ref, gate response) {
	t.Helper()
	for _, side := range []struct {
		name string
		r    response
	}{{"reference", ref}, {"memcgate", gate}} {
		if side.r.status != s.status {
			t.Errorf("%s: %s answered %v, want status %d", s.name, side.name, side.r, s.status)
		}
		if s.body != nil && string(side.r.body) != *s.body {
			t.Errorf("%s: %s body %q, want %q", s.name, side.name, side.r.body, *s.body)
		}
		for k, v := range s.hdr {
			if got := side.r.header.Get(k); got != v {
				t.Errorf("%s: %s header %s = %q, want %q", s.name, side.name, k, got, v)
			}
		}
	}
	if ref.status != gate.status {
		t.Errorf("%s: status differs:\n reference %v\n memcgate  %v", s.name, ref, gate)
		return
	}
	if s.req.keepAlive {
		wantClose := s.status == 400 || s.status == 413 || s.status == 500
		if ref.close != wantClose || gate.close != wantClose {
			t.Errorf("%s: Connection: close is reference %v, memcgate %v; want %v", s.name, ref.close, gate.close, wantClose)
		}
	}
	rt, gt := ref.header.Get("Content-Type"), gate.header.Get("Content-Type")
	if rt != gt {
		t.Errorf("%s: Content-Type differs: reference %q, memcgate %q", s.name, rt, gt)
	}
	for _, h := range []string{"X-Memc-Flags", "Last-Modified"} {
		if a, b := ref.header.Get(h), gate.header.Get(h); a != b {
			t.Errorf("%s: %s differs: reference %q, memcgate %q", s.name, h, a, b)
		}
	}
	if rt == "text/html" {
		return // nginx's error page: status and type only
	}
	if s.stats {
		rn, rok := statNames(ref.body)
		gn, gok := statNames(gate.body)
		if !rok || !gok || !slices.Equal(rn, gn) {
			t.Errorf("%s: stats replies differ in shape:\n reference %q\n memcgate  %q", s.name, rn, gn)
		}
		return
	}
	if !bytes.Equal(ref.body, gate.body) {
		t.Errorf("%s: body differs:\n reference %v\n memcgate  %v", s.name, ref, gate)
	}
	if ref.contentLength != gate.contentLength {
		t.Errorf("%s: Content-Length differs: reference %d, memcgate %d", s.name, ref.contentLength, gate.contentLength)
	}
}

// TestClusterCommands checks what the reference (one memcached) cannot
// show: flush_all and stats reach every node, and skip a node that health
// checks hold down, as every other command does.
func TestClusterCommands(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	gate := startGate(t, map[string]string{
		"MEMCGATE_SERVERS":   mcs[0].Addr + "," + mcs[1].Addr,
		"MEMCGATE_MEMC_PATH": "/memc",
	}, true)
	do := func(target string) response {
		t.Helper()
		r, err := send(gate, get(target))
		if err != nil {
			t.Fatalf("GET %s: %v", target, err)
		}
		return r
	}
	for i := range 40 {
		if r := do("/memc?cmd=set&key=k" + strconv.Itoa(i) + "&val=1"); r.status != 201 {
			t.Fatalf("set k%d: %v", i, r)
		}
	}
	for _, mc := range mcs {
		if keys, err := memcachedKeys(mc.Addr); err != nil || len(keys) == 0 {
			t.Fatalf("memcached %s holds %d keys (%v); want some of the 40", mc.Addr, len(keys), err)
		}
	}
	pids := func(body []byte) int { return strings.Count(string(body), "STAT pid ") }
	if r := do("/memc?cmd=stats"); r.status != 200 || pids(r.body) != 2 || strings.Count(string(r.body), "END\r\n") != 1 {
		t.Errorf("stats of 2 nodes = %v; want both nodes' STAT lines and one END", r)
	} else if _, ok := statNames(r.body); !ok {
		t.Errorf("stats of 2 nodes is not STAT lines and END: %q", r.body)
	}
	if r := do("/memc?cmd=version"); r.status != 200 || string(r.body) != "VERSION 1.6.18\r\n" {
		t.Errorf("version = %v, want one VERSION line", r)
	}
	if r := do("/memc?cmd=flush_all"); r.status != 200 || string(r.body) != "OK\r\n" {
		t.Fatalf("flush_all = %v, want 200 OK", r)
	}
	for _, mc := range mcs {
		if keys, err := memcachedKeys(mc.Addr); err != nil || len(keys) != 0 {
			t.Errorf("after flush_all memcached %s holds %q (%v), want none", mc.Addr, keys, err)
		}
	}

	mcs[1].Kill()
	// Until health checks notice, the dead node fails the command (502);
	// then it is skipped. Poll, do not sleep.
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := do("/memc?cmd=flush_all")
		if r.status == 200 {
			break
		}
		if r.status != 502 || time.Now().After(deadline) {
			t.Fatalf("flush_all with a node killed = %v; want 502 until it is marked down, then 200", r)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r := do("/memc?cmd=stats"); r.status != 200 || pids(r.body) != 1 {
		t.Errorf("stats with a node down = %v; want the live node's STAT lines", r)
	}
	if r := do("/memc?cmd=set&key=after&val=2"); r.status != 201 {
		t.Errorf("set with a node down = %v; want 201 (failover)", r)
	}
	if r := do("/memc?key=after"); r.status != 200 || string(r.body) != "2" {
		t.Errorf("get with a node down = %v; want 200 2", r)
	}
}
