package route

// Primary is the network the last Wait slept on (tests).
func (t *Transport) Primary() int { return int(t.primary.Load()) }
