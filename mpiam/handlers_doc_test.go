package mpiam

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/amgo-hpc/amgo/handlers"
	"github.com/stretchr/testify/require"
)

// The handler tables of docs/mpi.md name every handler mpiam registers, at
// its index and with its name, and nothing else.
func TestHandlerTablesInDocs(t *testing.T) {
	doc, err := os.ReadFile("../docs/mpi.md")
	require.NoError(t, err)
	documented := map[handlers.Index]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(mpi\\.[a-z.]+)` \\((\\d+)\\) \\|").FindAllStringSubmatch(string(doc), -1) {
		i, err := strconv.Atoi(m[2])
		require.NoError(t, err)
		require.NotContains(t, documented, handlers.Index(i), "index %d documented twice", i)
		documented[handlers.Index(i)] = m[1]
	}
	runJob(t, "loop", 1, Config{}, func(r *rk, c *Comm) {
		registered := map[handlers.Index]string{}
		for i := handlers.Index(1); i <= handlers.MaxClientIndex; i++ {
			if e, err := c.p.ep.Handlers().Lookup(i); err == nil && e.Name != "" {
				registered[i] = e.Name
			}
		}
		r.Equal(registered, documented)
	})
}
