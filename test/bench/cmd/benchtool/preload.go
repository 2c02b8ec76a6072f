package main

import (
	"bufio"
	"bytes"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// randString returns n random characters that need no escaping in a URL
// path, in nginx or in memcached.
func randString(r *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

// preload writes n random keys to -keys (one per line) and sets each of
// them in memcached to a random value, speaking the text protocol directly
// so that neither gateway is involved.
func preload(args []string) error {
	fs := flag.NewFlagSet("preload", flag.ExitOnError)
	addr := fs.String("addr", "", "memcached host:port")
	n := fs.Int("n", 10000, "number of keys")
	keyLen := fs.Int("keylen", 96, "key length")
	valLen := fs.Int("vallen", 400, "value length")
	keysFile := fs.String("keys", "", "file to write the keys to")
	valueFile := fs.String("value", "", "file to write one more random value to (the body PUTs send)")
	seed := fs.Uint64("seed", uint64(time.Now().UnixNano()), "random seed")
	derive := fs.String("derive", "", "derive key i as the hex SHA-384 of this prefix and i (96 characters), so that a PHP page can compute it")
	_ = fs.Parse(args)
	if *addr == "" || *keysFile == "" {
		return errors.New("preload: -addr and -keys are required")
	}
	if *derive != "" && *keyLen != 2*sha512.Size384 {
		return fmt.Errorf("preload: -derive makes %d-character keys, not %d", 2*sha512.Size384, *keyLen)
	}
	r := rand.New(rand.NewPCG(*seed, 0x6d656d63))
	keys := make([]string, 0, *n)
	seen := make(map[string]bool, *n)
	for len(keys) < *n {
		k := randString(r, *keyLen)
		if *derive != "" {
			sum := sha512.Sum384([]byte(*derive + strconv.Itoa(len(keys))))
			k = hex.EncodeToString(sum[:])
		}
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	if err := os.WriteFile(*keysFile, []byte(strings.Join(keys, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	if *valueFile != "" {
		if err := os.WriteFile(*valueFile, []byte(randString(r, *valLen)), 0o644); err != nil {
			return err
		}
	}

	conn, err := net.DialTimeout("tcp", *addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Minute))
	rd := bufio.NewReader(conn)
	values := make(map[string]string, len(keys))
	const batch = 200
	for i := 0; i < len(keys); i += batch {
		var buf bytes.Buffer
		end := min(i+batch, len(keys))
		for _, k := range keys[i:end] {
			v := randString(r, *valLen)
			values[k] = v
			fmt.Fprintf(&buf, "set %s 0 0 %d\r\n%s\r\n", k, len(v), v)
		}
		if _, err := conn.Write(buf.Bytes()); err != nil {
			return err
		}
		for range end - i {
			line, err := rd.ReadString('\n')
			if err != nil {
				return err
			}
			if line != "STORED\r\n" {
				return fmt.Errorf("set: memcached answered %q", line)
			}
		}
	}
	// Read a few back to be sure.
	for _, k := range []string{keys[0], keys[len(keys)/2], keys[len(keys)-1]} {
		fmt.Fprintf(conn, "get %s\r\n", k)
		hdr, err := rd.ReadString('\n')
		if err != nil {
			return err
		}
		want := fmt.Sprintf("VALUE %s 0 %d\r\n", k, *valLen)
		if hdr != want {
			return fmt.Errorf("get %s: header %q, want %q", k, hdr, want)
		}
		data := make([]byte, *valLen+2+5)
		if _, err := io.ReadFull(rd, data); err != nil {
			return err
		}
		if string(data) != values[k]+"\r\nEND\r\n" {
			return fmt.Errorf("get %s: value differs from what was set", k)
		}
	}
	fmt.Printf("preloaded %d keys of %d characters with %d-character values into %s\n", len(keys), *keyLen, *valLen, *addr)
	return nil
}
