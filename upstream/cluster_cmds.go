package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// NodeReply is one node's answer to a cluster-wide command.
type NodeReply struct {
	Node  string // host:port as configured
	Reply []byte // memcached's raw reply, e.g. "OK\r\n" or the STAT lines and "END\r\n"
	Err   error  // transport failure or ErrNoNodes (the node is down); nil if it answered
}

// FlushAll sends flush_all (with a delay in seconds, if positive) to every
// node that is up, in parallel, and returns each node's reply. Nodes that
// are down are reported with ErrNoNodes and not contacted. A node the
// flush did not reach (down, or failing) is flushed before its next
// re-admission instead (at once, whatever the delay), so that it does
// not come back with what the flush emptied everywhere else.
func (c *Cluster) FlushAll(ctx context.Context, delay int32) []NodeReply {
	cmd := "flush_all\r\n"
	if delay > 0 {
		cmd = "flush_all " + strconv.Itoa(int(delay)) + "\r\n"
	}
	nodes := c.topo.Load().nodes
	out := c.everyNodeOf(ctx, nodes, cmd, false, true) // it must reach them: it waits its turn past a busy node's share
	for i, r := range out {
		if r.Err != nil {
			nodes[i].flushOwed.Store(true)
			out[i].Err = fmt.Errorf("%w (it is flushed before it is re-admitted)", r.Err)
		}
	}
	return out
}

// Stats sends stats to every node that is up and returns the raw replies.
func (c *Cluster) Stats(ctx context.Context) []NodeReply {
	return c.everyNode(ctx, "stats\r\n", true)
}

// Version asks every node that is up for its version.
func (c *Cluster) Version(ctx context.Context) []NodeReply {
	return c.everyNode(ctx, "version\r\n", false)
}

func (c *Cluster) everyNode(ctx context.Context, cmd string, multiline bool) []NodeReply {
	return c.everyNodeOf(ctx, c.topo.Load().nodes, cmd, multiline, false)
}

// everyNodeOf is everyNode over nodes, whose replies it returns in
// order; queued as for command.
func (c *Cluster) everyNodeOf(ctx context.Context, nodes []*node, cmd string, multiline, queued bool) []NodeReply {
	out := make([]NodeReply, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		out[i].Node = n.name
		if !n.available() {
			out[i].Err = fmt.Errorf("%w: %s is down", ErrNoNodes, n.name)
			continue
		}
		wg.Go(func() { out[i].Reply, out[i].Err = n.command(ctx, cmd, multiline, queued) })
	}
	wg.Wait()
	return out
}

// nodeCommands is how many raw commands (command) run on one node at
// once. Each opens a connection of its own, and /memc?cmd=stats reaches
// them without a token when none are configured: 100 clients asking for
// stats as fast as they could opened 2,000 connections a second to every
// node, up to the node's whole in-flight cap at once, past memcached's
// own connection limit (-c, 1024 by default), and doubled other clients'
// latency. Commands past this many wait for their turn within their
// request's deadline.
const nodeCommands = 4

// command sends one raw text-protocol command that gomemcache does not
// offer (stats, version, flush_all with a delay) on a fresh connection,
// nodeCommands at a time, within the node's in-flight cap and socket
// timeout. It reads one line, or, if multiline, lines up to "END\r\n" or
// an error line. Such commands are rare (admin and compatibility
// endpoints), so they do not take or return pooled connections. The
// wait for a turn and a slot counts against the node's share of request
// slots (busy.go), unless queued (a flush_all, which must reach the
// node): a flood of stats requests for a slow node otherwise held every
// request slot, waiting for it.
func (n *node) command(ctx context.Context, cmd string, multiline, queued bool) ([]byte, error) {
	if !queued {
		if err := n.join(); err != nil {
			return nil, err
		}
	}
	for _, sem := range []chan struct{}{n.cmds, n.sem} {
		select {
		case sem <- struct{}{}:
			defer func() { <-sem }()
		case <-ctx.Done():
			if !queued {
				n.leave()
			}
			return nil, ctxError(n.name, "command", ctx.Err())
		}
	}
	if !queued {
		n.leave()
	} else {
		n.queued.Add(1) // as takeQueued: outside the share
		defer n.queued.Add(-1)
	}
	dctx, cancel := context.WithTimeout(ctx, n.timeout)
	defer cancel()
	conn, err := n.dial(dctx, "tcp", n.name)
	if err != nil {
		return nil, classify(n.name, "command", err)
	}
	defer conn.Close()
	deadline := time.Now().Add(n.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetDeadline(deadline)
	if _, err := conn.Write([]byte(cmd)); err != nil {
		return nil, classify(n.name, "command", err)
	}
	r := bufio.NewReader(conn)
	var reply []byte
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				return nil, fmt.Errorf("%w: %s: reply line too long", ErrServer, n.name)
			}
			return nil, classify(n.name, "command", err)
		}
		reply = append(reply, line...)
		if !multiline || bytes.Equal(line, []byte("END\r\n")) || isErrorLine(line) {
			return reply, nil
		}
		if len(reply) > 1<<20 {
			return nil, fmt.Errorf("%w: %s: reply over 1 MiB", ErrServer, n.name)
		}
	}
}

func isErrorLine(line []byte) bool {
	return bytes.HasPrefix(line, []byte("ERROR")) || bytes.HasPrefix(line, []byte("CLIENT_ERROR")) ||
		bytes.HasPrefix(line, []byte("SERVER_ERROR"))
}
