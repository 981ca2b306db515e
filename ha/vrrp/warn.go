package vrrp

import (
	"net/netip"
	"time"
)

// warnEvery is how often at most a warning about one source's
// advertisements is logged: a peer (or a host posing as one) that sends
// ten advertisements a second must not write ten log lines a second.
const warnEvery = time.Minute

// maxWarnSources bounds the sources a warnLimiter remembers; the sources
// beyond it share one entry, so that its memory stays bounded whatever
// the link sends.
const maxWarnSources = 16

// warnLimiter lets through at most one warning per source per warnEvery,
// and counts those it held back.
type warnLimiter struct {
	srcs map[netip.Addr]*warnState
}

type warnState struct {
	// last is what the source's previous advertisement said, for
	// warnings about a change.
	last string
	// next is when the next warning may be logged; suppressed counts
	// those held back since the last one logged.
	next       time.Time
	suppressed int
}

// state returns src's entry, or the shared one when the limiter is
// full.
func (l *warnLimiter) state(src netip.Addr) *warnState {
	if l.srcs == nil {
		l.srcs = map[netip.Addr]*warnState{}
	}
	s, ok := l.srcs[src]
	if ok {
		return s
	}
	if len(l.srcs) >= maxWarnSources {
		src = netip.Addr{}
		if s, ok = l.srcs[src]; ok {
			return s
		}
	}
	s = &warnState{}
	l.srcs[src] = s
	return s
}

// allow reports whether a warning about s may be logged at now, and how
// many were held back since the last one; a warning not allowed is
// counted.
func (s *warnState) allow(now time.Time) (bool, int) {
	if now.Before(s.next) {
		s.suppressed++
		return false, 0
	}
	n := s.suppressed
	s.suppressed, s.next = 0, now.Add(warnEvery)
	return true, n
}
