package pmi

import (
	"bufio"
	"errors"
	"fmt"
	"io"
)

// errLineTooLong is returned by readLine for a line longer than MaxLine; the
// rest of that line has been discarded when discard is set.
var errLineTooLong = fmt.Errorf("%w: line longer than %d bytes", ErrMalformed, MaxLine)

// readLine reads one '\n'-terminated line of at most MaxLine bytes (newline
// included) and returns it without the newline. At a clean end of stream it
// returns io.EOF; a partial last line gives io.ErrUnexpectedEOF. An overlong
// line gives errLineTooLong; with discard, the reader is advanced past its
// newline so that the next call reads the next line.
func readLine(r *bufio.Reader, discard bool) (string, error) {
	var buf []byte
	for {
		chunk, err := r.ReadSlice('\n')
		if len(buf)+len(chunk) > MaxLine {
			if discard {
				for errors.Is(err, bufio.ErrBufferFull) {
					_, err = r.ReadSlice('\n')
				}
			}
			return "", errLineTooLong
		}
		buf = append(buf, chunk...)
		switch {
		case err == nil:
			return string(buf[:len(buf)-1]), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			if len(buf) == 0 {
				return "", io.EOF
			}
			return "", io.ErrUnexpectedEOF
		default:
			return "", err
		}
	}
}

// newReader returns a line reader for a PMI connection.
func newReader(r io.Reader) *bufio.Reader { return bufio.NewReaderSize(r, 4096) }
