package gateway

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/memcgate/memcgate/upstream/op"
)

// keyRequest is a request for /{key}, parsed once into the operation it
// asks for: the routed and the detached paths serve it from this value.
type keyRequest struct {
	op    op.Op
	async bool   // Prefer: respond-async on a plain PUT or a DELETE
	etags string // a read's If-None-Match, all its lines (fieldList): 304 when it names the item's ETag
}

// keyParser reads requests for /{key} (parseKeyRequest).
type keyParser struct {
	maxKeyLen  int   // Options.MaxKeyLen
	defaultTTL int32 // Options.DefaultTTL, in seconds
}

// allowed is the Allow header of every 405 on /{key}.
const allowed = "GET, HEAD, PUT, DELETE, POST"

// parseKeyRequest reads the operation of a request for /{key} from its
// method, path, query and headers; a value is read from the body after
// (readBody). The verb:
//
//	GET         get; gat with ?touch=<exptime>
//	HEAD        head (the size, flags and CAS, not the value); gat with ?touch=
//	PUT         set; add with If-None-Match: *, replace with If-Match: *,
//	            cas with If-Match: "<cas>"
//	DELETE      delete; delete_cas with If-Match: "<cas>" (md C<cas>), or
//	            with If-Match: * (md: deleted only if the item exists)
//	POST        ?op=append, prepend, incr, decr (?delta=) or touch (?exptime=)
//
// A DELETE takes no If-None-Match, and a POST neither header
// (unconditional).
func (h keyParser) parseKeyRequest(r *http.Request) (keyRequest, error) {
	var kr keyRequest
	key, err := keyFromPath(r, h.maxKeyLen)
	if err != nil {
		return kr, err
	}
	o := &kr.op
	o.Item.Key = key
	q := r.URL.RawQuery
	if err := otherMethodsParam(r.Method, q); err != nil {
		return kr, err
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		o.Verb = op.Get
		if r.Method == http.MethodHead {
			o.Verb = op.Head
		}
		if _, ok := query(q, "touch"); ok {
			o.Verb = op.GAT
			if o.Item.Expiration, err = parseExptime(q, "touch", 0); err != nil {
				return kr, err
			}
		}
		kr.etags = fieldList(r.Header["If-None-Match"])
	case http.MethodPut:
		if err := h.parseItem(q, &o.Item); err != nil {
			return kr, err
		}
		ifMatch, ifNone, err := conditions(r.Header)
		if err != nil {
			return kr, err
		}
		if o.Verb, err = putVerb(ifMatch, ifNone, &o.Item); err != nil {
			return kr, err
		}
		kr.async = o.Verb == op.Set && preferAsync(r)
	case http.MethodDelete:
		ifMatch, ifNone, err := conditions(r.Header)
		if err != nil {
			return kr, err
		}
		if o.Verb, err = deleteVerb(ifMatch, ifNone, &o.Item); err != nil {
			return kr, err
		}
		kr.async = o.Verb == op.Delete && preferAsync(r)
	case http.MethodPost:
		if err := unconditional(r); err != nil {
			return kr, err
		}
		return kr, h.parsePost(q, o)
	default:
		return kr, &requestError{kind: kindMethod, msg: "method " + Shorten(r.Method) + " is not allowed; use " + allowed, allow: allowed}
	}
	return kr, nil
}

// otherMethodsParam refuses a parameter that names another method's
// operation: ?op= and ?delta= (POST), ?touch= (GET and HEAD). Ignored,
// they would turn the request into another one with nothing said:
// PUT /k?op=append replaces the value it meant to add to, PUT /k?touch=60
// stores it with the default expiry. Other parameters a method does not
// read (exptime on a GET, a cache-buster) are ignored as before.
func otherMethodsParam(method, q string) error {
	if q == "" {
		return nil
	}
	post, read := method == http.MethodPost, method == http.MethodGet || method == http.MethodHead
	switch {
	case !post && hasQuery(q, "op"):
		return badRequest(method + " does not take ?op=; POST /{key}?op= does (" + postVerbs + ")")
	case !post && hasQuery(q, "delta"):
		return badRequest(method + " does not take ?delta=; POST /{key}?op=incr or ?op=decr does")
	case !read && hasQuery(q, "touch"):
		return badRequest(method + " does not take ?touch=; GET does (get-and-touch); a write's expiry is ?exptime=, or POST /{key}?op=touch&exptime=")
	}
	return nil
}

// unconditional refuses If-Match and If-None-Match on a POST: the
// gateway sends append, prepend, incr, decr and touch with no CAS, so the
// condition cannot be kept, and ignored it would change an item that
// changed since the client's ETag (a batch refuses a cas on these verbs
// alike).
func unconditional(r *http.Request) error {
	for _, name := range [...]string{"If-Match", "If-None-Match"} {
		if len(r.Header.Values(name)) > 0 { // an empty line too: it was sent
			return badRequest(r.Method + " takes no " + name + ": it is applied unconditionally; a PUT (If-None-Match: * add, If-Match: * replace, If-Match: \"<etag>\" cas) and a DELETE (If-Match) are conditional")
		}
	}
	return nil
}

// conditions reads a PUT's or DELETE's If-Match and If-None-Match over
// all their field lines: several lines of one field are one list, their
// values joined by commas (RFC 9110 §5.3), which putVerb and deleteVerb
// refuse as they refuse a list on one line. Read from the first line
// alone, a condition on a later line was dropped, and an empty first
// line hid the rest: the write ran unconditionally, deleting or
// overwriting a version the client meant to keep. A field sent with no
// value is refused for the same reason (RFC 9110 reads an empty If-Match
// as a list that matches nothing), rather than read as no condition.
func conditions(h http.Header) (ifMatch, ifNone string, err error) {
	if ifMatch, err = condition(h, "If-Match"); err == nil {
		ifNone, err = condition(h, "If-None-Match")
	}
	return ifMatch, ifNone, err
}

// condition is the value of h's field name over all its lines (see
// conditions): "" when it is not sent, an error when sent empty.
func condition(h http.Header, name string) (string, error) {
	lines := h.Values(name)
	switch len(lines) {
	case 0:
		return "", nil
	case 1:
		if v := strings.Trim(lines[0], " \t"); v != "" {
			return v, nil
		}
		return "", badRequest(name + " has no value: send * or one ETag as GET returned it, like \"12345\", or leave the header out")
	}
	return strings.Join(lines, ", "), nil
}

// deleteVerb is the verb of a DELETE by its condition, with the CAS it
// names put in it: delete with none; with If-Match, delete_cas, of the
// ETag's CAS (and the replica that gave it out), or of none for *
// (deleted only if the item exists). If-None-Match is
// refused: * would delete only an item that is not there, and an ETag
// list (delete unless the item is one of these) is a check memcached
// cannot make in one command, so a stale read would race the delete.
func deleteVerb(ifMatch, ifNone string, it *op.Item) (op.Verb, error) {
	switch {
	case ifNone != "":
		return 0, badRequest("DELETE takes no If-None-Match; If-Match: \"<etag>\" deletes only the item the ETag names, If-Match: * only an item that exists")
	case ifMatch == "":
		return op.Delete, nil
	case ifMatch == "*":
		return op.DeleteCAS, nil
	}
	err := parseETag(ifMatch, it)
	if err == nil && it.CAS == 0 {
		// CAS 0 is no item's (memcached counts from 1), and
		// delete_cas reads it as * does.
		err = badRequest("If-Match " + strings.Trim(ifMatch, " \t") + " is not an ETag this gateway issued")
	}
	return op.DeleteCAS, err
}

// parseItem reads a write's ?exptime= and ?flags= into it.
func (h keyParser) parseItem(q string, it *op.Item) (err error) {
	if it.Expiration, err = parseExptime(q, "exptime", h.defaultTTL); err != nil {
		return err
	}
	it.Flags, err = parseFlags(q)
	return err
}

// putVerb is the verb of a PUT by its conditions, with the CAS of a cas
// (and the replica that gave it out) put in it.
func putVerb(ifMatch, ifNone string, it *op.Item) (op.Verb, error) {
	switch {
	case ifMatch == "" && ifNone == "":
		return op.Set, nil
	case ifMatch == "" && ifNone == "*":
		return op.Add, nil
	case ifMatch == "*" && ifNone == "":
		return op.Replace, nil
	case ifMatch != "" && ifNone == "":
		return op.CAS, parseETag(ifMatch, it)
	case ifMatch == "":
		return 0, badRequest("If-None-Match on a PUT takes * alone (add: stored only if the key is missing); a compare-and-swap is If-Match: \"<etag>\"")
	}
	return 0, badRequest("use If-None-Match: * (add), If-Match: * (replace) or If-Match: \"<etag>\" (cas), not both")
}

// postVerbs are the verbs POST /{key}?op= names.
const postVerbs = "append, prepend, incr, decr or touch"

// parsePost reads the operation of POST /{key}?op=.
func (h keyParser) parsePost(q string, o *op.Op) (err error) {
	name, _ := query(q, "op")
	switch o.Verb = op.Parse(name); o.Verb {
	case op.Append, op.Prepend:
	case op.Incr, op.Decr:
		o.Delta, err = parseDelta(q)
	case op.Touch:
		if _, ok := query(q, "exptime"); !ok {
			return badRequest("touch needs ?exptime=<seconds>")
		}
		o.Item.Expiration, err = parseExptime(q, "exptime", 0)
	default:
		if name == "" {
			return badRequest("POST needs ?op=" + strings.NewReplacer(", ", ", ?op=", " or ", " or ?op=").Replace(postVerbs))
		}
		return badRequest("unknown op " + quoted(name) + "; use " + postVerbs)
	}
	return err
}

// preferAsync reports whether the request asks for Prefer: respond-async
// (RFC 7240).
func preferAsync(r *http.Request) bool {
	for _, v := range r.Header.Values("Prefer") {
		for pref := range strings.SplitSeq(v, ",") {
			name, _, _ := strings.Cut(strings.TrimSpace(pref), ";")
			if strings.EqualFold(strings.TrimSpace(name), "respond-async") {
				return true
			}
		}
	}
	return false
}

// formatETag is the strong ETag of an item with CAS cas, given out by
// node (appendETag).
func formatETag(cas uint64, node uint32) string {
	var b [32]byte
	return string(appendETag(b[:0], cas, node))
}

// appendETag appends the strong ETag of an item with CAS cas to b: "<cas>"
// from the key's owner in a pool of one copy (node 0), "<cas>@<node>"
// from a replicated pool or from the node a pool of one copy failed the
// key over to, where node is the tag of the node that gave the CAS value
// out (op.Item.CASNode) in 8 lowercase hex digits: each node counts CAS
// values of its own, and a write checked against the ETag is checked on
// that node.
func appendETag(b []byte, cas uint64, node uint32) []byte {
	return append(appendCAS(append(b, '"'), cas, node), '"')
}

// appendCAS appends a CAS value as a batch answer gives it out (an ETag
// without its quotes) to b.
func appendCAS(b []byte, cas uint64, node uint32) []byte {
	b = strconv.AppendUint(b, cas, 10)
	if node == 0 {
		return b
	}
	const hex = "0123456789abcdef"
	b = append(b, '@')
	for shift := 28; shift >= 0; shift -= 4 {
		b = append(b, hex[node>>shift&0xf])
	}
	return b
}

// casNodeDigits is the length of an ETag's node part, after its '@'.
const casNodeDigits = 8

// parseCASValue reads a CAS value as appendCAS writes it: decimal digits,
// then, where a read names its node (a replica, a failover, a warm-up
// hit), '@' and the node's 8 lowercase hex digits (never all 0). why
// says what is wrong with s, "" if nothing is.
func parseCASValue(s string) (cas uint64, node uint32, why string) {
	digits, tag, named := strings.Cut(s, "@")
	cas, err := strconv.ParseUint(digits, 10, 64)
	if err != nil {
		return 0, 0, "its CAS value is not a decimal number below 2^64"
	}
	if !named {
		return cas, 0, ""
	}
	if len(tag) != casNodeDigits {
		return 0, 0, "after @ come the 8 lowercase hex digits of the node that gave the CAS value out"
	}
	for i := 0; i < len(tag); i++ {
		c := tag[i]
		switch {
		case c >= '0' && c <= '9':
			node = node<<4 | uint32(c-'0')
		case c >= 'a' && c <= 'f':
			node = node<<4 | uint32(c-'a'+10)
		default:
			return 0, 0, "after @ come the 8 lowercase hex digits of the node that gave the CAS value out"
		}
	}
	if node == 0 {
		return 0, 0, "no node is named 00000000"
	}
	return cas, node, ""
}

// parseETag reads the CAS value and the node that gave it out out of a
// strong ETag as formatETag writes it, into it. s is an If-Match list:
// it must be that one ETag, OWS around it (SP and HTAB, RFC 9110 §5.6.3).
// Unlike If-None-Match's (etagListHas), it needs no reading member by
// member: between its quotes come only the CAS value's digits, '@' and
// hex digits (parseCASValue), so a list, or a quoted string holding a
// comma or a quote, is refused whole.
func parseETag(s string, it *op.Item) error {
	s = strings.Trim(s, " \t")
	if len(s) < 3 || s[0] != '"' || s[len(s)-1] != '"' {
		return badRequest("If-Match takes * or one ETag as GET returned it, like \"12345\" (\"12345@0a1b2c3d\" where it names a node)")
	}
	cas, node, why := parseCASValue(s[1 : len(s)-1])
	if why != "" {
		msg := "If-Match " + s + " is not an ETag this gateway issued"
		if strings.Contains(s, "@") {
			msg += ": " + why
		}
		return badRequest(msg)
	}
	it.CAS, it.CASNode = cas, node
	return nil
}

// fieldList is the value of a list field over all its lines, lines:
// several lines of one field are one list, their values joined by commas
// (RFC 9110 §5.3). A read's If-None-Match taken from its first line
// alone answered 200 to a client whose ETag came on a later line, where
// 304 was due. One line, the common case, is returned as it is, with
// nothing allocated.
func fieldList(lines []string) string {
	switch len(lines) {
	case 0:
		return ""
	case 1:
		return lines[0]
	}
	return strings.Join(lines, ", ")
}

// etagListHas reports whether an If-None-Match list names etag (weak
// comparison, as RFC 9110 §13.1.2 asks for If-None-Match). A member is
// * or an entity-tag, [W/] and a quoted string that may hold commas
// (RFC 9110 §8.8.3), so the list is read member by member, not split on
// commas: split, the pieces of "a,"7"" or of an unclosed quote could
// equal etag though no member does, and a 304 would keep a client on a
// version it never held. A list that does not parse names nothing: a
// 200 is always a right answer to a read, a 304 only to one whose
// client sent the ETag.
func etagListHas(list, etag string) bool {
	found := false
	for i := 0; ; {
		for i < len(list) && (list[i] == ' ' || list[i] == '\t' || list[i] == ',') {
			i++ // OWS, and the empty members a list may hold (RFC 9110 §5.6.1)
		}
		if i == len(list) {
			return found
		}
		var tag string
		if tag, i = nextETag(list, i); i < 0 {
			return false
		}
		found = found || tag == "*" || strings.TrimPrefix(tag, "W/") == etag
	}
}

// nextETag reads the list member starting at list[i], * or an
// entity-tag, and the OWS after it: tag is the member as sent, next is
// where the next member's comma or the list's end is, -1 when the
// member does not parse or no comma follows it.
func nextETag(list string, i int) (tag string, next int) {
	start := i
	switch {
	case list[i] == '*':
		i++
	default:
		if strings.HasPrefix(list[i:], "W/") {
			i += 2
		}
		if i == len(list) || list[i] != '"' {
			return "", -1
		}
		for i++; i < len(list) && list[i] != '"'; i++ {
			if c := list[i]; c < 0x21 || c == 0x7f {
				return "", -1 // etagc: no space, no control byte
			}
		}
		if i == len(list) {
			return "", -1 // the quote is never closed
		}
		i++
	}
	tag = list[start:i]
	for i < len(list) && (list[i] == ' ' || list[i] == '\t') {
		i++
	}
	if i < len(list) && list[i] != ',' {
		return "", -1
	}
	return tag, i
}
