package gateway

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"unicode/utf8"
)

// marshalAnswer is the answer as json.Marshal writes it, the reference
// appendResults must match: each value as the string Value would carry.
func marshalAnswer(t *testing.T, results []batchResult) []byte {
	t.Helper()
	ref := make([]batchResult, len(results))
	for i, r := range results {
		if r.value != nil {
			v := string(r.value)
			if r.Encoding == "base64" {
				v = base64.StdEncoding.EncodeToString(r.value)
			}
			r.Value, r.value = &v, nil
		}
		ref[i] = r
	}
	out, err := json.Marshal(struct {
		Results []batchResult `json:"results"`
	}{ref})
	if err != nil {
		t.Fatalf("json.Marshal: %v", err)
	}
	return append(out, '\n')
}

// checkAnswer fails t unless appendResults writes what json.Marshal
// writes, of answerSize's length exactly.
func checkAnswer(t *testing.T, results []batchResult) {
	t.Helper()
	want := marshalAnswer(t, results)
	size := answerSize(results)
	got := appendResults(make([]byte, 0, size), results)
	if !bytes.Equal(got, want) {
		t.Errorf("appendResults =\n%q\njson.Marshal =\n%q", got, want)
	}
	if len(got) != size {
		t.Errorf("answer of %d bytes, answerSize said %d", len(got), size)
	}
}

// TestAnswerAsMarshal: the hand-written answer is byte for byte the one
// json.Marshal writes, for every field and every kind of byte in a value,
// key or error.
func TestAnswerAsMarshal(t *testing.T) {
	flags := uint32(4294967295)
	zero := uint32(0)
	n := "42"
	tests := []struct {
		name    string
		results []batchResult
	}{
		{"none", nil},
		{"found", []batchResult{{Key: "a", Status: 200, Flags: &zero, CAS: "17"}}},
		{"miss", []batchResult{{Key: "gone", Status: 404, Error: "key \"gone\" not found"}}},
		{"number", []batchResult{{Key: "n", Status: 200, Value: &n}}},
		{"all fields", []batchResult{{Key: "k<&>", Status: 503, Encoding: "base64", Flags: &flags, CAS: "18446744073709551615", PHPType: "string", Error: "x\u2028y"}}},
		{"several", []batchResult{{Key: "a", Status: 200}, {Key: "b", Status: 507, Error: "answer full"}, {Key: "c", Status: 200, CAS: "1"}}},
	}
	values := []string{
		"", "plain", `"\"\\`, "\b\f\n\r\t", "\x00\x01\x0b\x1f\x7f", "<a href='x'>&amp;</a>",
		"\u2028\u2029", "\u2027\u202a", "x\u2028", "é€😀\ufffd", "\xff", "\xe2\x80", "\u2028\xff\u2029", "\xed\xa0\x80",
	}
	for _, v := range values {
		var r batchResult
		r.Key, r.Status, r.Flags = "v", 200, &zero
		r.setValue([]byte(v))
		tests = append(tests, struct {
			name    string
			results []batchResult
		}{"value " + v, []batchResult{r}})
		tests = append(tests, struct {
			name    string
			results []batchResult
		}{"key and error " + v, []batchResult{{Key: v, Status: 400, Error: v}}})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkAnswer(t, tt.results) })
	}
}

// TestAnswerAsMarshalRandom compares random values, keys and errors of
// bytes drawn mostly from the ones JSON escapes.
func TestAnswerAsMarshalRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	pieces := []string{"a", "é", "😀", "\u2028", "\u2029", "\xe2\x80", "\xff", "\x00", "\x1f", "<", ">", "&", `"`, `\`, "\n", "\x7f", "\xed\xa0\x80", "\xc3"}
	str := func() string {
		var b []byte
		for range rng.IntN(12) {
			b = append(b, pieces[rng.IntN(len(pieces))]...)
		}
		return string(b)
	}
	for range 2000 {
		results := make([]batchResult, 1+rng.IntN(3))
		for i := range results {
			r := &results[i]
			r.Key, r.Status = str(), 200+rng.IntN(400)
			switch rng.IntN(3) {
			case 0:
				r.setValue([]byte(str()))
			case 1:
				r.Error = str()
			}
		}
		checkAnswer(t, results)
		if t.Failed() {
			return
		}
	}
}

// BenchmarkAnswer encodes a multi-get's answer of ten found values with
// json.Marshal, as the gateway did, and with appendResults, side by side.
func BenchmarkAnswer(b *testing.B) {
	for _, size := range []int{400, 100_000} {
		// Text in lines of 64 bytes, one quote each: a little to escape.
		value := bytes.Repeat([]byte("a \"quoted\" line of text, as a cached fragment of a page has.\n"), size/64)
		flags := uint32(0)
		results := make([]batchResult, 10)
		for i := range results {
			results[i] = batchResult{Key: "key-" + strconv.Itoa(i), Status: 200, Flags: &flags, CAS: "12345"}
			results[i].setValue(value)
		}
		b.Run(fmt.Sprintf("%d/marshal", size), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ref := make([]batchResult, len(results))
				for i, r := range results {
					v := string(r.value)
					r.Value, r.value = &v, nil
					ref[i] = r
				}
				out, _ := json.Marshal(struct {
					Results []batchResult `json:"results"`
				}{ref})
				_ = append(out, '\n')
			}
		})
		b.Run(fmt.Sprintf("%d/append", size), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = appendResults(make([]byte, 0, answerSize(results)), results)
			}
		})
	}
}

// FuzzAnswerAsMarshal: for any key, value, error and other fields, the
// hand-written answer is json.Marshal's, within answerSize, and jsonLen
// counts what appendJSONString writes for a value of valid UTF-8.
func FuzzAnswerAsMarshal(f *testing.F) {
	f.Add("k<&>", []byte("v\u2028\x00\"\\"), "err \xff", "12", "string", 200, uint32(7), uint8(1))
	f.Add("\xe2\x80", []byte("\xff\xfe"), "", "", "", 404, uint32(0), uint8(0))
	f.Add("", []byte(nil), "\u2029", "18446744073709551615", "", -1, uint32(4294967295), uint8(2))
	f.Add("k", []byte("v"), "", "", "", math.MinInt, uint32(0), uint8(6))
	f.Fuzz(func(t *testing.T, key string, value []byte, errMsg, cas, phpType string, status int, flags uint32, mode uint8) {
		if utf8.Valid(value) {
			if got, want := jsonLen(value), len(appendJSONString(nil, value))-2; got != want {
				t.Fatalf("jsonLen(%q) = %d, appendJSONString wrote %d", value, got, want)
			}
		} else if got, want := jsonLen(value), base64.StdEncoding.EncodedLen(len(value)); got != want {
			t.Fatalf("jsonLen(%q) = %d, base64 is %d", value, got, want)
		}
		r := batchResult{Key: key, Status: status, Error: errMsg, CAS: cas, PHPType: phpType}
		if mode&1 != 0 {
			r.Flags = &flags
		}
		switch mode >> 1 & 3 {
		case 1: // a found value, as setItem gives it
			r.setValue(value)
		case 2: // a number, as an incr's
			v := string(value)
			r.Value = &v
		case 3: // a value and an error in one result, and a second result
			r.setValue(value)
			other := batchResult{Key: errMsg, Status: status / 3, Error: key}
			checkAnswer(t, []batchResult{r, other})
			return
		}
		checkAnswer(t, []batchResult{r})
	})
}
