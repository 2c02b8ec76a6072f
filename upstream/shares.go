package upstream

// Shares returns each node's fraction of the key space on the ring, by
// node name (host:port as configured): the share of keys the node owns
// while every node is up, whatever their state now. The fractions sum to
// 1. They were computed once when the ring was built (see
// hashring.Ring.Shares), so Shares is cheap; the map is the caller's.
func (c *Cluster) Shares() map[string]float64 {
	t := c.topo.Load()
	shares := t.ring.Shares()
	out := make(map[string]float64, len(t.nodes))
	for i, n := range t.nodes {
		out[n.name] = shares[i]
	}
	return out
}
