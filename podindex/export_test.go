package podindex

// What the tests count and production code never asks.

// Len returns the number of pods indexed.
func (x *Index) Len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	n := 0
	for _, pods := range x.pods {
		n += len(pods)
	}
	return n
}

// Len returns the number of pods indexed over all namespaces.
func (n *Namespaces) Len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	total := 0
	for _, c := range n.covered {
		total += c.Index.Len()
	}
	return total
}
