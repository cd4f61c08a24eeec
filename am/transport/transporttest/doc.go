// Package transporttest is the conformance suite that every amgo transport
// runs, in the spirit of GASNet's testam/testcore programs: the same tests on
// every network. A transport's test calls Run with a function that opens a job
// of n ranks:
//
//	func TestConformance(t *testing.T) {
//		transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
//			ts, err := loop.NewJob(n, nil)
//			require.NoError(t, err)
//			return ts
//		})
//	}
//
// Transports whose constructor needs a transport.Bootstrap can use
// NewBootstraps (n ranks in one process: an in-memory key-value space and
// barrier) or FileBootstrap (ranks in separate processes sharing a directory).
package transporttest
