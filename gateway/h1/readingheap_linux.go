package h1

// before orders the reading heap: by deadline, none last.
func before(a, b *conn) bool {
	da, db := a.pf.deadline, b.pf.deadline
	return !da.IsZero() && (db.IsZero() || da.Before(db))
}

func (p *poller) heapPushLocked(c *conn) {
	c.pf.hidx = len(p.reading)
	p.reading = append(p.reading, c)
	p.heapUpLocked(c.pf.hidx)
}

// unheapLocked takes c out of the reading heap, if it is in it.
func (p *poller) unheapLocked(c *conn) {
	i := c.pf.hidx
	if i < 0 || i >= len(p.reading) || p.reading[i] != c {
		return
	}
	last := len(p.reading) - 1
	p.heapSwapLocked(i, last)
	p.reading[last] = nil
	p.reading = p.reading[:last]
	c.pf.hidx = -1
	if i < last {
		p.heapDownLocked(i)
		p.heapUpLocked(i)
	}
	if len(p.reading) == 0 && cap(p.reading) > 1024 {
		p.reading = nil // a flood of new connections is over: let its array go
	}
}

func (p *poller) heapSwapLocked(i, j int) {
	h := p.reading
	h[i], h[j] = h[j], h[i]
	h[i].pf.hidx, h[j].pf.hidx = i, j
}

func (p *poller) heapUpLocked(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !before(p.reading[i], p.reading[parent]) {
			return
		}
		p.heapSwapLocked(i, parent)
		i = parent
	}
}

func (p *poller) heapDownLocked(i int) {
	n := len(p.reading)
	for {
		least, l, r := i, 2*i+1, 2*i+2
		if l < n && before(p.reading[l], p.reading[least]) {
			least = l
		}
		if r < n && before(p.reading[r], p.reading[least]) {
			least = r
		}
		if least == i {
			return
		}
		p.heapSwapLocked(i, least)
		i = least
	}
}
