//go:build !linux

package h1

import (
	"sync/atomic"
	"time"
)

// poller parks idle connections on Linux only (poll_linux.go); elsewhere
// every connection keeps its goroutine.
type poller struct {
	abandoned atomic.Bool
	roomLen   atomic.Int32 // never set here
}

// pollFields are a conn's fields for the poller: registered is never set here.
type pollFields struct{ registered bool }

// park results.
const (
	parked = iota
	readable
	notParked
)

func newPoller(time.Duration, int) (*poller, error) { return nil, nil }

func (p *poller) run()                                     {}
func (p *poller) park(*conn) int                           { return notParked }
func (p *poller) parkReading(*conn, int32, time.Time) int  { return notParked }
func (p *poller) parkBody(*conn, time.Time, time.Time) int { return notParked }
func (p *poller) admit(*conn) bool                         { return false }
func (p *poller) forget(*conn)                             {}
func (p *poller) close(bool)                               {}
func (p *poller) requeue(*conn) bool                       { return false }
func (p *poller) evict() *conn                             { return nil }
func (p *poller) roomWaiting() bool                        { return false }
func (p *poller) watchRoom(Budget)                         {}

func (p *poller) waitRoom(*conn, Budget, int64, time.Time, bool) int { return notParked }
