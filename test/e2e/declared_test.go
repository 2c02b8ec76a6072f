package e2e

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"testing"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestDeclaredBodiesTakeNoBudget: clients that send PUT heads declaring
// a body and then nothing, or one byte, hold none of the byte budget:
// another client's PUT of a 100 KB value is stored and read back. Each
// held 16 KiB of it for the read timeout, and as many as the budget
// holds 16 KiB buffers (4,096 with the default 64 MiB) had every other
// client's large body and value refused with 503.
func TestDeclaredBodiesTakeNoBudget(t *testing.T) {
	mc := memcachedtest.Start(t)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_MAX_BUFFERED_BYTES": "1048576"})
	const heads = 80 // 80 × 16 KiB: more than the budget
	for i := range heads {
		c, _ := dialRaw(t, g.DataAddr)
		head := "PUT /declared/" + strconv.Itoa(i) + " HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
		if i%2 == 1 {
			head += "b"
		}
		if _, err := io.WriteString(c, head); err != nil {
			t.Fatal(err)
		}
	}
	value := bytes.Repeat([]byte("v"), 100000)
	req, _ := http.NewRequest(http.MethodPut, "http://"+g.DataAddr+"/declared/legit", bytes.NewReader(value))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("PUT of 100 KB beside %d declared bodies: %s %q, want 201", heads, resp.Status, body)
	}
	resp, err = http.Get("http://" + g.DataAddr + "/declared/legit")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, value) {
		t.Fatalf("GET of the value: %s, %d bytes", resp.Status, len(got))
	}
}
