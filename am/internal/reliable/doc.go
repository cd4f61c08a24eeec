// Package reliable gives amgo ordered, exactly-once delivery per peer over a
// network that may lose, reorder and duplicate packets.
package reliable
