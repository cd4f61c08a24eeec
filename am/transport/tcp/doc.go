// Package tcp is amgo's transport between processes on many hosts.
package tcp
