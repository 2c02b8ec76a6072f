package h1

// ConnStats counts a Server's client connections: those it serves by
// state, and all it has taken. Connections handed over to Fallback are
// counted by it (http.Server.ConnState), not here.
type ConnStats struct {
	// Reading connections wait in the poller for the rest of a request,
	// or, new, for their first bytes: a slow or silent client shows here.
	Reading int
	// WaitingForRoom of the reading ones wait for room in the budget for
	// their body (Server.BudgetWait).
	WaitingForRoom int
	// Idle connections wait between requests.
	Idle int
	// Active connections hold a worker: reading a request that is
	// arriving, running its handler or writing its response.
	Active int
	// Accepted is every connection the Server has served, closed ones
	// included.
	Accepted uint64
	// AcceptErrors counts accept failures the Server waited out and
	// retried: mostly a lack of file descriptors (EMFILE), the sign of
	// too many open connections for the process's open-file limit.
	AcceptErrors uint64
	// Reclaimed counts idle or silent connections closed to make room for
	// new ones under MaxConns, and idle ones Fallback served closed to
	// make room for a handover at its limit; Refused the new ones
	// answered 503 and closed because there was none.
	Reclaimed, Refused uint64
	// HandoversRefused counts requests answered 503, their connections
	// closed, instead of handed to Fallback, because as many connections
	// as allowed (a thirty-second of MaxConns, at least 64) were
	// Fallback's.
	HandoversRefused uint64
	// BadRequests counts requests answered 400 and closed before any
	// handler saw them: heads the fast path cannot read, and framing a
	// proxy in front may read differently (Content-Length with
	// Transfer-Encoding, Transfer-Encoding on HTTP/1.0), refused by the
	// fast path or by GuardConn on connections handed to Fallback. What
	// Fallback's net/http refuses itself is not counted.
	BadRequests uint64
	// HeaderTimeouts counts connections closed because a request head or
	// a new connection's first bytes did not come within the header
	// timeout, and IdleTimeouts those closed between requests at the idle
	// timeout. A body not whole within the read timeout is not counted:
	// its request goes to the handler, which answers it. Connections
	// handed to Fallback are net/http's to time out.
	HeaderTimeouts, IdleTimeouts uint64
}

// ConnStats returns the connection counts now. It takes the Server's lock
// and visits every connection: for metrics scrapes, not per request.
func (s *Server) ConnStats() ConnStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := ConnStats{Accepted: s.accepted, AcceptErrors: s.acceptErrs.Load(), Reclaimed: s.reclaimed.Load(), Refused: s.refused.Load(), HandoversRefused: s.handedRefused.Load(), BadRequests: s.badRequests.Load(),
		HeaderTimeouts: s.hdrTimeouts.Load(), IdleTimeouts: s.idleTimeouts.Load()}
	if s.poller != nil {
		st.WaitingForRoom = int(s.poller.roomLen.Load())
	}
	for c := range s.conns {
		switch c.state.Load() {
		case stateNew, stateReading:
			st.Reading++
		case stateIdle, stateParked:
			st.Idle++
		case stateActive:
			st.Active++
		}
	}
	return st
}
