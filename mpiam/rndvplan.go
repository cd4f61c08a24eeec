package mpiam

// transferPlan is how a matched rendezvous message moves, decided by
// planTransfer from the sizes and the network's abilities alone.
type transferPlan struct {
	// push is how many bytes, from the start of the message, the sender
	// stores into the receive buffer after a clear-to-send.
	push int
	// pull: the receiver reads bytes [push, n) of the send buffer itself
	// (am.Endpoint.Get) and then sends the pulled notice.
	pull bool
	// cts: the receiver sends a clear-to-send naming where the sender stores
	// its push bytes (0 bytes: a fin instead of a store).
	cts bool
	// more: the clear-to-send is not the receiver's final word to the sender
	// (the pulled notice follows), so the send keeps waiting after its store.
	more bool
	// recvParts is what the receive waits for: its get, and/or the handler
	// of the sender's store (or fin). The send, which learns the plan from
	// the receiver's messages, waits for the receiver's final word (a pulled
	// notice, or a clear-to-send without more) and for its own store.
	recvParts int
}

// planTransfer decides how a rendezvous message of n bytes (the receive's
// share of it) moves: offered says that the sender offered its buffer's
// address, canGet that this rank can read the sender's memory with one copy
// (am.Endpoint.CanGet), split the smallest message that the two sides move
// half each (0: never).
//
//   - pull: the receiver reads all of it; the pulled notice is its only word.
//   - split (a get and n >= split): the sender stores the first half, rounded
//     down to 4 KiB, while the receiver reads the rest: both cores copy.
//   - store (no get): a clear-to-send, and the sender stores all of it.
func planTransfer(n int, offered, canGet bool, split int) transferPlan {
	var t transferPlan
	t.push = n
	if offered && canGet {
		t.push = 0
		if split > 0 && n >= split {
			t.push = (n / 2) &^ 4095
		}
		t.pull = true
		t.recvParts = 1 // the get
	}
	if t.pull && t.push == 0 {
		return t // the pulled notice is the receiver's only word
	}
	t.cts = true
	t.recvParts++ // the store's (or fin's) handler
	t.more = t.pull
	return t
}
