package match_test

import (
	"fmt"

	"github.com/amgo-hpc/amgo/mpiam/internal/match"
)

// Rank 0 sends two messages to rank 1 on one context; they arrive in the wrong
// order. Rank 1 has posted a wildcard receive and then an exact one.
func Example() {
	// Rank 0 numbers its messages to rank 1 on context 7: 0, 1, ...
	env0 := match.Envelope{Context: 7, Source: 0, Tag: 5, Seq: 0}
	env1 := match.Envelope{Context: 7, Source: 0, Tag: 5, Seq: 1}

	e := match.New[string, string]() // on rank 1
	_, _, _, ok := e.Post(match.Spec{Context: 7, Source: match.AnySource, Tag: match.AnyTag}, "irecv A")
	fmt.Println("A matched at post:", ok)
	e.Post(match.Spec{Context: 7, Source: 0, Tag: 5}, "irecv B")

	var out []match.Match[string, string]
	out, _ = e.Arrive(env1, "second message", out[:0])
	fmt.Println("after the second message:", len(out), "matches, held:", e.Stats().Held)
	out, _ = e.Arrive(env0, "first message", out[:0])
	for _, m := range out {
		fmt.Printf("%s <- %s (seq %d)\n", m.Recv, m.Msg, m.Env.Seq)
	}
	// Output:
	// A matched at post: false
	// after the second message: 0 matches, held: 1
	// irecv A <- first message (seq 0)
	// irecv B <- second message (seq 1)
}
