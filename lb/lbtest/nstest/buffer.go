package nstest

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent use: the output of a
// peer daemon (keepalived, bird) that a test reads while it runs.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
