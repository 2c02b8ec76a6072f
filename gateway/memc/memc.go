// Package memc serves the HttpMemcModule-compatible endpoints: what
// nginx + memc-nginx-module 0.19 answer, byte for byte where the module
// writes the body, so that clients of such a tier can be pointed at
// memcgate unchanged. The behaviour and every deliberate difference are
// in docs/migrating-from-nginx-memc.md; test/memc runs the same requests
// against the real module and memcgate side by side.
//
// Its refusals (a kind each check names) and its commands' outcomes map
// to the module's statuses and bodies in one place, memcFailure in
// errors.go, not through the REST API's mapping. It runs as a gateway.Route, under
// the gateway's request IDs, metrics, access log and limits.
package memc

import (
	"bytes"
	"context"
	"errors"
	"html"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/memcgate/memcgate/gateway"
	"github.com/memcgate/memcgate/gateway/chunk"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// Store runs one operation (*route.Router and *upstream.Cluster implement
// it, and *chunk.Values, which also deletes the chunks of a value stored
// in chunks and refuses to append to one).
type Store interface {
	Do(ctx context.Context, o op.Op) op.Result
}

// Cluster runs the commands that reach every node (*route.Router, every
// node of every pool, and *upstream.Cluster implement it).
type Cluster interface {
	FlushAll(ctx context.Context, delay int32) []upstream.NodeReply
	Stats(ctx context.Context) []upstream.NodeReply
	Version(ctx context.Context) []upstream.NodeReply
}

// Options configures the endpoints. Zero values take the defaults named
// on each field.
type Options struct {
	// Path is the query-style endpoint, like the reference `location =
	// /memc` with `set $memc_cmd $arg_cmd; set $memc_key $arg_key; set
	// $memc_value $arg_val; set $memc_flags $arg_flags; set $memc_exptime
	// $arg_exptime;`. It matches this path exactly. "" turns it off.
	Path string
	// KeyPath is the path-style prefix, like the reference `location ~
	// ^/key/(.+)$` with `set $memc_key $1;`: the key is the rest of the
	// normalised path, the value the request body, the command the method
	// or ?cmd=. It must start and end with '/'. "" turns it off.
	KeyPath string
	// CmdsAllowed, if not empty, lists the only commands served; others get
	// 403, like memc_cmds_allowed. Unknown names are ignored.
	CmdsAllowed []string
	// FlagsToLastModified sends a get hit's flags as Last-Modified (Unix
	// seconds), like memc_flags_to_last_modified on.
	FlagsToLastModified bool
	// FlagsHeader, if set, names a header that carries $memc_flags on 2xx
	// answers, like `add_header X-Memc-Flags $memc_flags;`.
	FlagsHeader string
	// ContentType is the type of every body the module writes itself
	// (values, STORED, numbers, raw error lines), nginx's default_type; if
	// empty, "text/plain".
	ContentType string
	// MaxBodyBytes is client_max_body_size: a larger request body gets 413
	// whatever the command. If zero, 1 MiB (nginx's default 1m).
	MaxBodyBytes int64
	// MaxKeyLen is the longest key sent to memcached (250 minus the key
	// prefix); if zero, 250.
	MaxKeyLen int
	// Access, if not nil, has the bearer tokens each command's scope is
	// checked against (read, write, admin for the commands that reach
	// every node) and the read-only mode that refuses the commands that
	// write; the gateway's own, so that a reload changes both.
	Access *gateway.Access
	// Store runs the keyed commands; required.
	Store Store
	// Cluster runs flush_all, stats and version on every node; required.
	Cluster Cluster
}

// memcCmd is one command of the module.
type memcCmd uint8

const (
	memcNone memcCmd = iota
	memcGet
	memcSet
	memcAdd
	memcReplace
	memcAppend
	memcPrepend
	memcDelete
	memcIncr
	memcDecr
	memcFlushAll
	memcStats
	memcVersion
	memcCmdCount
)

// parseMemcCmd matches a command name exactly and case-sensitively, as the
// module does; anything else (gets, cas, touch, GET…) is memcNone.
func parseMemcCmd(name string) memcCmd {
	for c := memcGet; c < memcCmdCount; c++ {
		if c.String() == name {
			return c
		}
	}
	return memcNone
}

func (c memcCmd) String() string {
	switch c {
	case memcGet:
		return "get"
	case memcSet:
		return "set"
	case memcAdd:
		return "add"
	case memcReplace:
		return "replace"
	case memcAppend:
		return "append"
	case memcPrepend:
		return "prepend"
	case memcDelete:
		return "delete"
	case memcIncr:
		return "incr"
	case memcDecr:
		return "decr"
	case memcFlushAll:
		return "flush_all"
	case memcStats:
		return "stats"
	case memcVersion:
		return "version"
	}
	return ""
}

func (c memcCmd) storage() bool { return c >= memcSet && c <= memcPrepend }

func (c memcCmd) arith() bool { return c == memcIncr || c == memcDecr }

// keyed reports whether the command names an item.
func (c memcCmd) keyed() bool { return c >= memcGet && c <= memcDecr }

// scope is the bearer-token scope the command needs: cluster-wide commands
// need admin, as on the admin listener.
func (c memcCmd) scope() gateway.Scope {
	switch c {
	case memcGet, memcVersion:
		return gateway.ScopeRead
	case memcFlushAll, memcStats:
		return gateway.ScopeAdmin
	}
	return gateway.ScopeWrite
}

// writes reports whether the command changes data (refused in read-only
// mode).
func (c memcCmd) writes() bool {
	return c.storage() || c == memcDelete || c.arith() || c == memcFlushAll
}

// memcDefaultCmd is the command of a request without $memc_cmd.
func memcDefaultCmd(method string) memcCmd {
	switch method {
	case http.MethodGet, http.MethodHead:
		return memcGet
	case http.MethodPost:
		return memcAdd
	case http.MethodPut:
		return memcSet
	case http.MethodDelete:
		return memcDelete
	}
	return memcNone
}

// memcVars are the module's variables as a location's configuration set
// them, raw (never URL-decoded).
type memcVars struct {
	cmd, key, flags, exptime string
	value                    string
	valueSet                 bool // $memc_value is defined (even empty): the body is not the value
}

// memc serves the compatible endpoints.
type memc struct {
	o       Options
	allowed [memcCmdCount]bool
}

// New returns the endpoints as a gateway route, or false if both are
// off. They are one route rather than routes of a mux so that they see
// every method, as nginx does (OPTIONS or PATCH get the module's 400, not
// a 405), and they authorize per command, not per method: GET ?cmd=set
// is a write.
func New(o Options) (gateway.Route, bool) {
	if o.Path == "" && o.KeyPath == "" {
		return gateway.Route{}, false
	}
	m := &memc{o: o}
	if m.o.Access == nil {
		m.o.Access = new(gateway.Access)
	}
	if m.o.ContentType == "" {
		m.o.ContentType = "text/plain"
	}
	if m.o.MaxBodyBytes <= 0 {
		m.o.MaxBodyBytes = 1 << 20
	}
	if m.o.MaxKeyLen <= 0 {
		m.o.MaxKeyLen = gateway.MaxKeyLen
	}
	for c := memcGet; c < memcCmdCount; c++ {
		m.allowed[c] = len(o.CmdsAllowed) == 0
	}
	for _, name := range o.CmdsAllowed {
		m.allowed[parseMemcCmd(name)] = true
	}
	m.allowed[memcNone] = false
	return gateway.Route{Owns: m.owns, MaxBody: m.o.MaxBodyBytes, Handler: m}, true
}

// owns reports whether a request for path is the compatible endpoints'.
func (m *memc) owns(path string) bool {
	return m.o.Path != "" && path == m.o.Path || m.o.KeyPath != "" && strings.HasPrefix(path, m.o.KeyPath)
}

// ServeHTTP serves a request for one of the endpoints.
func (m *memc) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if m.o.Path != "" && r.URL.Path == m.o.Path {
		_, q := splitTarget(r.RequestURI)
		m.serve(w, r, queryVars(q))
		return
	}
	m.servePath(w, r)
}

// queryVars is the reference /memc location: every variable from its
// argument, so $memc_value is defined (empty) even without ?val= and the
// request body is never the value.
func queryVars(q string) memcVars {
	v := memcVars{valueSet: true}
	v.cmd, _ = nginxArg(q, "cmd")
	v.key, _ = nginxArg(q, "key")
	v.value, _ = nginxArg(q, "val")
	v.flags, _ = nginxArg(q, "flags")
	v.exptime, _ = nginxArg(q, "exptime")
	return v
}

// servePath is the reference /key/ location: nginx normalises the path,
// the regex captures the key (re-escaped when the raw path was quoted),
// and $memc_value is left undefined so storage commands take the body.
func (m *memc) servePath(w http.ResponseWriter, r *http.Request) {
	rawPath, q := splitTarget(r.RequestURI)
	path, quoted, err := nginxPath(rawPath)
	if err != nil {
		m.fail(w, r, memcNone, refuse(kindPath, "the request path is not valid (bad %-escape, %00 or .. above the root)"))
		return
	}
	if m.o.Path != "" && path == m.o.Path {
		m.serve(w, r, queryVars(q))
		return
	}
	key, ok := regexCapture(path, m.o.KeyPath)
	if !ok {
		m.fail(w, r, memcNone, refuse(kindNoLocation, "no key in the path; use "+m.o.KeyPath+"{key}"))
		return
	}
	if quoted {
		key = argsEscape(key)
	}
	v := memcVars{key: key}
	v.cmd, _ = nginxArg(q, "cmd")
	v.flags, _ = nginxArg(q, "flags")
	v.exptime, _ = nginxArg(q, "exptime")
	m.serve(w, r, v)
}

// serve runs one request through the module's checks, then the command.
func (m *memc) serve(w http.ResponseWriter, r *http.Request, v memcVars) {
	cmd, key, value, err := m.check(r, v)
	if err != nil {
		m.fail(w, r, cmd, err)
		return
	}
	m.run(w, r, cmd, v, key, value)
}

// check runs the module's checks in the module's order (the first that
// fails decides the answer) and returns the command, the escaped key and
// the value to send, or a refusal naming what was wrong, with the command
// if it was known by then.
func (m *memc) check(r *http.Request, v memcVars) (cmd memcCmd, key string, value []byte, err error) {
	// nginx refuses a declared body over client_max_body_size before any
	// location code runs, whatever the command.
	if r.ContentLength > m.o.MaxBodyBytes {
		return memcNone, "", nil, refuse(kindTooLarge, "request body is "+strconv.FormatInt(r.ContentLength, 10)+" bytes; at most "+strconv.FormatInt(m.o.MaxBodyBytes, 10)+" are accepted (MEMCGATE_MEMC_MAX_BODY_BYTES)")
	}
	tokens, readOnly := m.o.Access.Tokens(), m.o.Access.ReadOnly()
	var have gateway.Scope
	if tokens.Enabled() {
		var ok bool
		if have, ok = tokens.Scopes(r); !ok {
			return memcNone, "", nil, refuse(kindNoToken, "missing or unknown bearer token")
		}
	}
	// 1. The command: $memc_cmd, or the method's default.
	cmd = memcDefaultCmd(r.Method)
	if v.cmd != "" {
		cmd = parseMemcCmd(v.cmd)
	}
	if cmd == memcNone {
		if v.cmd != "" {
			return cmd, "", nil, refuse(kindCommand, "unknown command "+strconv.Quote(gateway.Shorten(v.cmd)))
		}
		return cmd, "", nil, refuse(kindCommand, "method "+gateway.Shorten(r.Method)+" has no default command; use ?cmd=")
	}
	// 2. memc_cmds_allowed, then memcgate's own authorization.
	if !m.allowed[cmd] {
		return cmd, "", nil, refuse(kindNotAllowed, "command "+cmd.String()+" is not allowed here")
	}
	if tokens.Enabled() && have&cmd.scope() == 0 {
		return cmd, "", nil, refuse(kindNoScope, "token lacks the "+cmd.scope().String()+" scope for "+cmd.String())
	}
	if !tokens.Enabled() && cmd.scope() != gateway.ScopeRead && gateway.FromOtherSite(r) {
		// Not the module's: without it any web page could flush the
		// cluster with an <img> (docs/security.md, "Browsers").
		return cmd, "", nil, refuse(kindOtherSite, "a browser sent "+cmd.String()+" from a page of another site (Sec-Fetch-Site, Origin): refused, so that web pages cannot change the cache; commands from pages need a bearer token (MEMCGATE_AUTH_TOKENS)")
	}
	if readOnly && cmd.writes() {
		return cmd, "", nil, refuse(kindReadOnly, "read-only mode: "+cmd.String()+" is disabled (MEMCGATE_READ_ONLY)")
	}
	// 3-5. Digit-only checks; the range is memcached's business.
	if (cmd.storage() || cmd == memcDelete || cmd == memcFlushAll) && v.exptime != "" && !digits(v.exptime, 10) {
		return cmd, "", nil, refuse(kindArgument, "exptime must be 1 to 10 digits")
	}
	if cmd.storage() && v.flags != "" && !digits(v.flags, 10) {
		return cmd, "", nil, refuse(kindArgument, "flags must be 1 to 10 digits")
	}
	if cmd.arith() && !digits(v.value, 19) {
		if !v.valueSet {
			// The path style, like its reference location, sets no
			// $memc_value: no request to it has a delta.
			return cmd, "", nil, refuse(kindArgument, cmd.String()+" takes its delta from ?val= on the query endpoint (MEMCGATE_MEMC_PATH); this endpoint has none, as the module's location ~ ^/key/(.+)$")
		}
		return cmd, "", nil, refuse(kindArgument, cmd.String()+" needs ?val= with a delta of 1 to 19 digits")
	}
	// 6. The body, read (and capped) whatever the command, as nginx does.
	body, hasBody, err := m.readBody(r)
	if err != nil {
		return cmd, "", nil, &refusal{kind: kindBody, err: err}
	}
	// 7. Building the memcached request.
	if cmd.keyed() && v.key == "" {
		return cmd, "", nil, refuse(kindNoKey, "no key")
	}
	value = []byte(v.value)
	if cmd.storage() && !v.valueSet {
		if !hasBody {
			return cmd, "", nil, refuse(kindNoValue, "no value: send a request body (Content-Length: 0 for an empty value)")
		}
		value = body
	}
	key = memcEscape(v.key)
	if cmd == memcDelete && v.exptime != "" && v.exptime != "0" {
		// upstream.Store has no delete with a time, so memcached's answer
		// to one is given here without sending.
		return cmd, "", nil, refuse(kindDeleteTime, "delete takes no time but 0")
	}
	if cmd.keyed() && len(key) > m.o.MaxKeyLen {
		// memcached refuses such a key, and the module sends it anyway:
		// memcached then runs a storage command's data block as a command
		// of its own. memcgate gives the same answer and never sends it.
		return cmd, "", nil, refuse(kindKeyTooLong, "key is "+strconv.Itoa(len(key))+" bytes after escaping; memcached allows "+strconv.Itoa(m.o.MaxKeyLen))
	}
	return cmd, key, value, nil
}

// verbs are the operations of the keyed commands.
var verbs = [memcCmdCount]op.Verb{
	memcGet: op.Get, memcSet: op.Set, memcAdd: op.Add, memcReplace: op.Replace, memcAppend: op.Append,
	memcPrepend: op.Prepend, memcDelete: op.Delete, memcIncr: op.Incr, memcDecr: op.Decr,
}

// run sends the command and answers as the module does. The key is
// placed as nginx's `hash $memc_key consistent` places it: by the key
// before the module's escaping.
func (m *memc) run(w http.ResponseWriter, r *http.Request, cmd memcCmd, v memcVars, key string, value []byte) {
	if !cmd.keyed() {
		m.cluster(w, r, cmd, v)
		return
	}
	o := op.Op{Verb: verbs[cmd], Item: op.Item{Key: key}}
	if key != v.key {
		o.HashKey = v.key
	}
	switch {
	case cmd.storage():
		o.Item.Value, o.Item.Flags, o.Item.Expiration = value, memcFlags(v.flags), memcExptime(v.exptime)
	case cmd.arith():
		o.Delta = parseDigits(v.value)
	}
	var res op.Result
	size := -1 // the value's length, for a HEAD answered from op.Head
	switch {
	case cmd == memcGet && r.Method == http.MethodHead:
		// memcached sends the size, flags and CAS, not the value; an
		// item with an index's flags is read to tell whether it is one.
		o.Verb = op.Head
		if res = gateway.GetValue(r, m.o.Store, o); res.Err != nil || res.Item.Flags != chunk.IndexFlags {
			size = int(res.N)
			break
		}
		o.Verb = op.Get
		fallthrough
	case cmd == memcGet:
		// The value held against the byte budget until it is written,
		// as the REST API's GETs hold theirs.
		res = gateway.GetValue(r, m.o.Store, o)
	default:
		res = m.o.Store.Do(r.Context(), o)
	}
	err := res.Err
	switch {
	case cmd == memcGet:
		if err == nil && chunk.IsIndex(res.Item.Flags, res.Item.Value) {
			err = chunk.ErrChunked // never the index's bytes as the value
		}
		if err != nil {
			m.fail(w, r, cmd, err)
			return
		}
		flags := strconv.FormatUint(uint64(res.Item.Flags), 10)
		if m.o.FlagsToLastModified {
			w.Header().Set("Last-Modified", time.Unix(int64(res.Item.Flags), 0).UTC().Format(http.TimeFormat))
		}
		if size >= 0 {
			m.moduleHead(w, size, flags)
			return
		}
		m.module(w, r, http.StatusOK, res.Item.Value, flags)
	case cmd.storage():
		flags := v.flags
		if flags == "" {
			flags = "0"
		}
		switch {
		case err == nil:
			m.module(w, r, http.StatusCreated, []byte("STORED\r\n"), flags)
		case errors.Is(err, upstream.ErrNotFound), errors.Is(err, upstream.ErrExists):
			m.module(w, r, http.StatusOK, []byte("NOT_STORED\r\n"), flags)
		default:
			m.fail(w, r, cmd, err)
		}
	case cmd == memcDelete:
		if err != nil {
			m.fail(w, r, cmd, err)
			return
		}
		m.module(w, r, http.StatusOK, []byte("DELETED\r\n"), v.flags)
	default: // incr, decr
		if err != nil {
			m.fail(w, r, cmd, err)
			return
		}
		m.module(w, r, http.StatusCreated, []byte(strconv.FormatUint(res.N, 10)+"\r\n"), v.flags)
	}
}

// cluster runs flush_all, stats and version. Nodes that health checks hold
// down are skipped, as they are for every other command (their keys are
// served by the live nodes, which are the ones flushed). The answer:
//   - flush_all: OK once every live node said OK;
//   - stats: each live node's STAT lines in configured order, one END;
//   - version: the first live node's VERSION line.
//
// A live node that fails or answers an error line fails the whole command
// (502, or 504 on a timeout), except for version, which takes the next
// node; no live node at all is 502, like nginx with its server down.
func (m *memc) cluster(w http.ResponseWriter, r *http.Request, cmd memcCmd, v memcVars) {
	if m.o.Cluster == nil {
		m.fail(w, r, cmd, upstream.ErrNoNodes)
		return
	}
	ctx := r.Context()
	var replies []upstream.NodeReply
	switch cmd {
	case memcFlushAll:
		replies = m.o.Cluster.FlushAll(ctx, memcExptime(v.exptime))
	case memcStats:
		replies = m.o.Cluster.Stats(ctx)
	default:
		replies = m.o.Cluster.Version(ctx)
	}
	if cmd == memcStats {
		// Every node's reply (up to 1 MiB each, of which memcached sends
		// some 3 KB) and the answer they are copied into stay until it
		// is written: held against the byte budget, as GET's values are,
		// or dropped unsent (503) when it has no room for them.
		n := 0
		for _, nr := range replies {
			n += len(nr.Reply)
		}
		if err := gateway.HoldAnswer(r, 2*n); err != nil {
			m.fail(w, r, cmd, err)
			return
		}
	}
	var body []byte
	answered := 0
	var failed error
	for _, nr := range replies {
		switch {
		case errors.Is(nr.Err, upstream.ErrNoNodes):
			continue // held down by health checks: skipped
		case nr.Err != nil:
			failed = nr.Err
			continue
		case isMemcErrorLine(nr.Reply):
			failed = &memcErrorLine{line: string(nr.Reply)}
			continue
		}
		answered++
		switch cmd {
		case memcStats:
			body = append(body, bytes.TrimSuffix(nr.Reply, []byte("END\r\n"))...)
		case memcVersion:
			if body == nil {
				body = nr.Reply
			}
		default:
			body = nr.Reply
		}
	}
	switch {
	case cmd == memcVersion && answered > 0:
	case failed != nil:
		m.fail(w, r, cmd, failed)
		return
	case answered == 0:
		m.fail(w, r, cmd, upstream.ErrNoNodes)
		return
	}
	if cmd == memcStats {
		body = append(body, "END\r\n"...)
	}
	m.module(w, r, http.StatusOK, body, v.flags)
}

func isMemcErrorLine(b []byte) bool {
	s := string(b)
	return strings.HasPrefix(s, "ERROR") || strings.HasPrefix(s, "CLIENT_ERROR") || strings.HasPrefix(s, "SERVER_ERROR")
}

// readBody reads the request body up to MaxBodyBytes and reports whether
// the request had one at all (a Content-Length header, even 0, or a
// chunked body), which for a storage command without $memc_value is the
// difference between storing an empty value and 500.
func (m *memc) readBody(r *http.Request) (body []byte, present bool, err error) {
	present = r.ContentLength != 0 || len(r.TransferEncoding) > 0 || len(r.Header.Values("Content-Length")) > 0
	if !present || r.Body == nil {
		return nil, present, nil
	}
	body, err = gateway.ReadBody(r, m.o.MaxBodyBytes, "MEMCGATE_MEMC_MAX_BODY_BYTES")
	return body, true, err
}

// module writes a body the module generates itself, with the flags header
// (skipped when flags is empty, like add_header with an empty value).
func (m *memc) module(w http.ResponseWriter, r *http.Request, status int, body []byte, flags string) {
	hd := w.Header()
	if m.o.FlagsHeader != "" && flags != "" {
		hd.Set(m.o.FlagsHeader, flags)
	}
	m.write(w, r, status, m.o.ContentType, body)
}

// moduleHead answers a HEAD of a value of size bytes as module would.
func (m *memc) moduleHead(w http.ResponseWriter, size int, flags string) {
	hd := w.Header()
	if m.o.FlagsHeader != "" && flags != "" {
		hd.Set(m.o.FlagsHeader, flags)
	}
	hd.Set("Content-Type", m.o.ContentType)
	hd.Set("Content-Length", strconv.Itoa(size))
	w.WriteHeader(http.StatusOK)
}

// raw writes a memcached error line as the module forwards it.
func (m *memc) raw(w http.ResponseWriter, r *http.Request, status int, line string) {
	m.write(w, r, status, m.o.ContentType, []byte(line))
}

// page writes an error page shaped like nginx's (text/html, the status in
// the title and heading); the footer names memcgate and the reason.
func (m *memc) page(w http.ResponseWriter, r *http.Request, status int, reason string) {
	w.Header().Del("Last-Modified")
	title := strconv.Itoa(status) + " " + nginxStatusText(status)
	body := "<html>\r\n<head><title>" + title + "</title></head>\r\n<body>\r\n<center><h1>" + title +
		"</h1></center>\r\n<hr><center>memcgate: " + html.EscapeString(reason) + "</center>\r\n</body>\r\n</html>\r\n"
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusInternalServerError:
		// nginx closes the client connection after these; for 413 the
		// body may not have been read at all.
		w.Header().Set("Connection", "close")
	}
	m.write(w, r, status, "text/html", []byte(body))
}

func (m *memc) write(w http.ResponseWriter, r *http.Request, status int, contentType string, body []byte) {
	hd := w.Header()
	hd.Set("Content-Type", contentType)
	hd.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}

// nginxStatusText is the reason phrase nginx puts on its error pages.
func nginxStatusText(status int) string {
	if status == http.StatusGatewayTimeout {
		return "Gateway Time-out"
	}
	return http.StatusText(status)
}
