package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// MaxFileSize is the largest configuration file, main or included, that
// vipd reads: 16 MiB, with room to spare above the single file of 10,000
// services with 10 backends each that the benchmark reads. A larger file
// is refused before it is read, and one that grows past the limit while it
// is read is refused too, so that a stray log or disk image matched by an
// include pattern cannot exhaust the daemon's memory.
const MaxFileSize = 16 << 20

// ErrNotRegular says that a configuration path names something other than
// a regular file (or a symbolic link to one): a FIFO, a device, a socket
// or a directory, which vipd refuses to read because reading it may block
// forever or never end.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge says that a configuration file is larger than MaxFileSize.
var ErrTooLarge = errors.New("too large")

// readFile reads the configuration file at path, following symbolic
// links: a regular file of at most MaxFileSize bytes. It is how every
// configuration file is read (Load, Reload, the included files and the
// Watcher).
func readFile(path string) ([]byte, error) { return readFileLimit(path, MaxFileSize) }

// readFileLimit is readFile with a size limit of limit bytes. It never
// blocks on what is not a regular file: the path is checked before it is
// opened, it is opened without blocking (a FIFO swapped in between the
// check and the open has no writer to wait for), and the opened file is
// checked again before anything is read. The limit is checked against the
// size of the opened file and enforced while reading, for a file that
// grows meanwhile (or whose size the file system does not report).
func readFileLimit(path string, limit int64) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if err := checkFile(path, fi, limit); err != nil {
		return nil, err
	}
	if testHookBeforeOpen != nil {
		testHookBeforeOpen(path)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err = f.Stat(); err != nil {
		return nil, err
	}
	if err := checkFile(path, fi, limit); err != nil {
		return nil, err
	}
	// One allocation when the size is right, with room to see the end.
	var b bytes.Buffer
	b.Grow(int(min(fi.Size(), limit)) + bytes.MinRead)
	if _, err := b.ReadFrom(io.LimitReader(f, limit+1)); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	data := b.Bytes()
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: %w: more than %d bytes were read, the limit is %s", path, ErrTooLarge, limit, sizeString(limit))
	}
	return data, nil
}

// testHookBeforeOpen, when set by a test, runs between the check of the
// path and its opening.
var testHookBeforeOpen func(path string)

// checkFile returns an error naming path unless fi describes a regular
// file of at most limit bytes.
func checkFile(path string, fi fs.FileInfo, limit int64) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: %w (%s)", path, ErrNotRegular, FileKind(fi.Mode()))
	}
	if fi.Size() > limit {
		return fmt.Errorf("%s: %w: %d bytes, the limit is %s", path, ErrTooLarge, fi.Size(), sizeString(limit))
	}
	return nil
}

// FileKind names the type of a file that is not a regular one, for the
// errors of a reader that refuses it ("a FIFO", "a directory").
func FileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "file mode " + m.String()
}

// sizeString writes a limit in bytes, and in MiB when it is a whole number
// of them.
func sizeString(n int64) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d bytes (%d MiB)", n, n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// Limits on the included files together: MaxFileSize bounds each, these
// bound how many an include pattern may match and what they may hold
// together, so that a pattern matching a directory of large files (or a
// great many small ones) is refused before it exhausts the daemon or
// vipd check.
const (
	// MaxIncludedFiles is the most files the include patterns may
	// match.
	MaxIncludedFiles = 4096
	// MaxIncludedSize is the most bytes the included files may hold
	// together: 64 MiB, four times the largest file.
	MaxIncludedSize = 64 << 20
)

// ErrTooMany says that the included files are too many or too large
// together.
var ErrTooMany = errors.New("too many included files")

// checkIncluded returns an error unless n included files of size bytes
// together are within MaxIncludedFiles and MaxIncludedSize.
func checkIncluded(n int, size int64) error {
	switch {
	case n > MaxIncludedFiles:
		return fmt.Errorf("%w: %d files match the include patterns, the limit is %d", ErrTooMany, n, MaxIncludedFiles)
	case size > MaxIncludedSize:
		return fmt.Errorf("%w: the included files hold more than %s together", ErrTooMany, sizeString(MaxIncludedSize))
	}
	return nil
}

// checkIncludedWith checks the included files of c with data in place of
// part pi's text (added, when pi < 0) against the limits of
// checkIncluded.
func (c *Config) checkIncludedWith(pi int, data []byte) error {
	n, size := len(c.parts)-1, int64(len(data))
	if pi < 0 {
		n++
	}
	for i := 1; i < len(c.parts); i++ {
		if i != pi {
			size += int64(len(c.parts[i].src))
		}
	}
	return checkIncluded(n, size)
}
