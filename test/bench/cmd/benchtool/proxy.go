package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
)

// proxy serves PUT /{key} as a memcached set, the least a gateway that
// copies a value can do: a goroutine and a memcached connection of its
// own per client connection, the body read whole into a reused buffer,
// written with its command in one writev, and answered by memcached's
// reply. It checks nothing, bounds nothing, and answers only PUT: it is
// the floor of big-value PUTs in bench.sh, as nginx's constant body is
// the floor of an HTTP hop, not something to run in front of clients.
//
// With -splice the body goes from the client's socket to memcached's
// through a pipe (Go's TCPConn.ReadFrom uses splice(2) for a TCP
// source), never copied into the process: what a gateway that does not
// read a value could save.
func proxy(args []string) error {
	fs := flag.NewFlagSet("proxy", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address to serve on")
	memc := fs.String("memc", "", "memcached host:port")
	splice := fs.Bool("splice", false, "move bodies with splice(2) instead of copying them")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *memc == "" {
		return errors.New("proxy: -memc is required")
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	bufs := &sync.Pool{New: func() any { return new([]byte) }}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			if err := proxyConn(c.(*net.TCPConn), *memc, *splice, bufs); err != nil && !errors.Is(err, io.EOF) {
				fmt.Fprintln(os.Stderr, "benchtool proxy:", err)
			}
		}()
	}
}

// proxyConn serves one client connection's PUTs until it closes.
func proxyConn(c *net.TCPConn, memc string, splice bool, bufs *sync.Pool) error {
	defer c.Close()
	mc, err := net.Dial("tcp", memc)
	if err != nil {
		return err
	}
	defer mc.Close()
	replies := bufio.NewReader(mc)
	in := make([]byte, 8192) // the head, and what came with it
	n := 0
	for {
		end := bytes.Index(in[:n], []byte("\r\n\r\n"))
		for end < 0 {
			if n == len(in) {
				return errors.New("head larger than 8 KiB")
			}
			m, err := c.Read(in[n:])
			if err != nil {
				return err
			}
			n += m
			end = bytes.Index(in[:n], []byte("\r\n\r\n"))
		}
		end += 4
		key, length, err := putHead(in[:end])
		if err != nil {
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
			return err
		}
		came := min(n-end, length) // the body's start, read with the head
		cmd := fmt.Appendf(nil, "set %s 0 0 %d\r\n", key, length)
		if splice {
			if _, err := mc.Write(append(cmd, in[end:end+came]...)); err != nil {
				return err
			}
			if _, err := mc.(*net.TCPConn).ReadFrom(io.LimitReader(c, int64(length-came))); err != nil {
				return err
			}
			if _, err := mc.Write([]byte("\r\n")); err != nil {
				return err
			}
		} else {
			bp := bufs.Get().(*[]byte)
			if cap(*bp) < length {
				*bp = make([]byte, length)
			}
			body := (*bp)[:length]
			copy(body, in[end:end+came])
			if _, err := io.ReadFull(c, body[came:]); err != nil {
				return err
			}
			w := net.Buffers{cmd, body, []byte("\r\n")}
			_, err := w.WriteTo(mc)
			bufs.Put(bp) // the kernel has its copy
			if err != nil {
				return err
			}
		}
		n = copy(in, in[end+came:n])
		line, err := replies.ReadSlice('\n')
		if err != nil {
			return err
		}
		status := "201 Created"
		if !bytes.Equal(line, []byte("STORED\r\n")) {
			status = "502 Bad Gateway"
		}
		if _, err := fmt.Fprintf(c, "HTTP/1.1 %s\r\nContent-Length: 0\r\n\r\n", status); err != nil {
			return err
		}
	}
}

// maxBody is the largest body proxy takes: memcached's largest item
// (-I) is 1 GB at most, and the bench's values are 1 MB; a larger
// Content-Length is refused before anything is allocated for it.
const maxBody = 64 << 20

// putHead returns the key and Content-Length of a head "PUT /{key} ...".
func putHead(head []byte) (key string, length int, err error) {
	line, rest, _ := bytes.Cut(head, []byte("\r\n"))
	f := bytes.Fields(line)
	if len(f) != 3 || string(f[0]) != "PUT" || len(f[1]) < 2 || f[1][0] != '/' {
		return "", 0, fmt.Errorf("not a PUT /{key}: %q", line)
	}
	length = -1
	for h := range bytes.SplitSeq(rest, []byte("\r\n")) {
		name, v, ok := bytes.Cut(h, []byte(":"))
		if ok && bytes.EqualFold(name, []byte("Content-Length")) {
			length, err = strconv.Atoi(string(bytes.TrimSpace(v)))
			if err != nil || length < 0 || length > maxBody {
				return "", 0, fmt.Errorf("bad Content-Length %q", v)
			}
		}
	}
	if length < 0 {
		return "", 0, errors.New("no Content-Length")
	}
	return string(f[1][1:]), length, nil
}
