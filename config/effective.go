package config

import (
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Redacted stands in for a secret in Effective's values.
const Redacted = "REDACTED"

// Effective is the configuration as it is in force, for /debug/config.
type Effective struct {
	// Values holds every variable's value as it would be written in the
	// environment (a duration as 500ms, the servers as host:port[:weight]
	// joined by commas), defaults included. Secrets are redacted: each
	// token of AUTH_TOKENS becomes REDACTED, its scopes stay.
	Values map[string]string `json:"values"`
	// Changed lists, in declaration order, the variables whose value is
	// not their default.
	Changed []string `json:"changed"`
	// Warnings are c.Warnings().
	Warnings []string `json:"warnings"`
}

// Effective returns c as it is in force, secrets redacted.
func (c Config) Effective() Effective {
	defaults, _ := parse(map[string]string{})
	e := Effective{Values: map[string]string{}, Changed: []string{}, Warnings: c.Warnings()}
	if e.Warnings == nil {
		e.Warnings = []string{}
	}
	cv, dv := reflect.ValueOf(c), reflect.ValueOf(defaults)
	for _, v := range vars(reflect.TypeFor[Config](), Prefix) {
		val := formatValue(cv.FieldByIndex(v.index))
		if val != formatValue(dv.FieldByIndex(v.index)) {
			e.Changed = append(e.Changed, v.Name)
		}
		if v.secret != "" && val != "" {
			val = redactTokens(val)
		}
		e.Values[v.Name] = val
	}
	return e
}

// formatValue writes a field's value as its variable would hold it.
func formatValue(f reflect.Value) string {
	switch x := f.Interface().(type) {
	case time.Duration:
		return formatDuration(x)
	case []Server:
		s := make([]string, len(x))
		for i, srv := range x {
			s[i] = srv.String()
		}
		return strings.Join(s, ",")
	case Pools:
		return x.String()
	case string:
		return x
	case bool:
		return strconv.FormatBool(x)
	case int:
		return strconv.Itoa(x)
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	}
	return "?" // a field type added without a case here (TestEffective)
}

// formatDuration is d.String() without trailing zero units: 1m, not 1m0s.
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// redactTokens replaces the token of every scopes:token entry by
// Redacted, keeping the scopes; an entry without scopes is redacted whole.
func redactTokens(s string) string {
	var out []string
	for e := range strings.FieldsFuncSeq(s, func(r rune) bool { return r == ',' || r == '\n' || r == '\r' }) {
		e = strings.TrimSpace(e)
		if e == "" || strings.HasPrefix(e, "#") {
			continue // as ParseTokens skips them
		}
		if scopes, _, ok := strings.Cut(e, ":"); ok {
			out = append(out, scopes+":"+Redacted)
		} else {
			out = append(out, Redacted)
		}
	}
	return strings.Join(out, ",")
}
