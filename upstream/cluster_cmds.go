package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/memcgate/memcgate/upstream/panicguard"
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
	out := c.everyNodeOf(ctx, nodes, opFlushAll, cmd, false, true) // it must reach them: it waits its turn past a busy node's share
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
	return c.everyNode(ctx, opStats, "stats\r\n", true)
}

// Version asks every node that is up for its version.
func (c *Cluster) Version(ctx context.Context) []NodeReply {
	return c.everyNode(ctx, opVersion, "version\r\n", false)
}

func (c *Cluster) everyNode(ctx context.Context, o metricOp, cmd string, multiline bool) []NodeReply {
	return c.everyNodeOf(ctx, c.topo.Load().nodes, o, cmd, multiline, false)
}

// everyNodeOf is everyNode over nodes, whose replies it returns in
// order; queued as for command. Each node's command is counted and timed
// as o (countCommand); a node passed over as down is not: nothing went
// to it.
func (c *Cluster) everyNodeOf(ctx context.Context, nodes []*node, o metricOp, cmd string, multiline, queued bool) []NodeReply {
	out := make([]NodeReply, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		out[i].Node = n.name
		if !n.available() {
			out[i].Err = fmt.Errorf("%w: %s is down", ErrNoNodes, n.name)
			continue
		}
		wg.Go(func() {
			out[i].Err = panicguard.ErrPanicked // what a stopped panic leaves
			defer c.cmdPanics.Recover()
			start := time.Now()
			out[i].Reply, out[i].Err = n.command(ctx, cmd, multiline, queued)
			n.countCommand(o, start, out[i].Reply, out[i].Err)
		})
	}
	wg.Wait()
	return out
}

// countCommand counts and times a raw command's result in the node's
// operation metrics, as count does an operation's: an error line
// memcached answered is rejected. It is not fed to passive health, as
// no raw command is: a raw command's connection has none of the data
// path's allowances for a deadline the gateway came to late (0069), and
// the probes and the data path already see what its timeout would say.
func (n *node) countCommand(o metricOp, start time.Time, reply []byte, err error) {
	n.m.duration[o].Observe(time.Since(start).Seconds())
	res := resultOf(err)
	if err == nil && isErrorLine(reply) {
		res = resRejected
	}
	n.m.ops[o][res].Inc()
}

// nodeCommands is how many raw commands (command) run on one node at
// once, and how many idle connections a node keeps for them. Commands
// past this many wait for their turn within their request's deadline.
// The bound is there because /memc?cmd=stats reaches them without a token
// when none are configured: with a connection of its own per command, 100
// clients asking for stats as fast as they can open 2,000 connections a
// second to every node, up to the node's whole in-flight cap at once,
// past memcached's own connection limit (-c, 1024 by default), and double
// other clients' latency.
const nodeCommands = 4

// command sends one raw text-protocol command that gomemcache does not
// offer (stats, version, flush_all with a delay), nodeCommands at a time,
// within the node's in-flight cap and socket timeout. It reads one line,
// or, if multiline, lines up to "END\r\n" or an error line. The wait for
// a turn and a slot counts against the node's share of request slots
// (busy.go), unless queued (a flush_all, which must reach the node): a
// flood of stats requests for a slow node otherwise held every request
// slot, waiting for it.
//
// It runs on an idle connection of the node's cmdIdle, or a new one, and
// gives it back once the reply is read whole: a connection per command
// made memcached accept one per /memc?cmd=version (130 µs of its CPU
// each, ten GETs' worth) and left the gateway's host with thousands of
// sockets in TIME_WAIT. A connection that failed, timed out, or answered
// an error line is closed, not kept. An idle connection can have been
// closed by memcached (restarted, or its idle timeout): a kept connection
// that fails before any byte of the reply, other than by a timeout, is
// replaced by a new one and the command sent again (every such command
// may be sent twice: reading stats and version changes nothing, and a
// second flush_all flushes what the first did).
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
	deadline := time.Now().Add(n.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for {
		conn := n.cmdIdle.get()
		kept := conn != nil
		if !kept {
			dctx, cancel := context.WithDeadline(ctx, deadline)
			c, err := n.dial(dctx, "tcp", n.name)
			cancel()
			if err != nil {
				return nil, classify(n.name, "command", err)
			}
			conn = &idleConn{Conn: c, br: bufio.NewReader(c)}
		}
		reply, errLine, err := roundTrip(conn, cmd, multiline, deadline)
		switch {
		case err == nil && !errLine:
			n.cmdIdle.put(conn)
			return reply, nil
		case err == nil:
			conn.Close() // after an error line the connection's state is not worth trusting
			return reply, nil
		}
		conn.Close()
		var ne net.Error
		if kept && len(reply) == 0 && !(errors.As(err, &ne) && ne.Timeout()) && ctx.Err() == nil {
			continue // a kept connection memcached had closed
		}
		if errors.Is(err, ErrServer) {
			return nil, fmt.Errorf("%s: %w", n.name, err)
		}
		return nil, classify(n.name, "command", err)
	}
}

// roundTrip writes cmd on conn and reads its reply, by deadline: one
// line, or, if multiline, lines up to "END\r\n" or an error line
// (errLine: the reply is then that line alone, the lines before it
// dropped). It returns what it read of the reply, with the error that
// stopped it (an ErrServer for a reply it refuses).
func roundTrip(conn *idleConn, cmd string, multiline bool, deadline time.Time) (reply []byte, errLine bool, err error) {
	_ = conn.SetDeadline(deadline)
	if _, err := io.WriteString(conn, cmd); err != nil {
		return nil, false, err
	}
	for {
		line, err := conn.br.ReadSlice('\n')
		reply = append(reply, line...)
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				return reply, false, fmt.Errorf("%w: reply line too long", ErrServer)
			}
			return reply, false, err
		}
		if isErrorLine(line) {
			// The reply is that error, whatever came before it:
			// callers look for an error line at a reply's start
			// (a stats reply of STAT lines, then SERVER_ERROR, was
			// relayed by memc as 200 with the error inside).
			return reply[len(reply)-len(line):], true, nil
		}
		if !multiline || bytes.Equal(line, []byte("END\r\n")) {
			return reply, false, nil
		}
		if len(reply) > 1<<20 {
			return reply, false, fmt.Errorf("%w: reply over 1 MiB", ErrServer)
		}
	}
}

func isErrorLine(line []byte) bool {
	return bytes.HasPrefix(line, []byte("ERROR")) || bytes.HasPrefix(line, []byte("CLIENT_ERROR")) ||
		bytes.HasPrefix(line, []byte("SERVER_ERROR"))
}
