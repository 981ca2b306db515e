package health

import "time"

// machine is the rise/fall state machine of one check.
type machine struct {
	state     State
	since     time.Time
	successes int // consecutive
	failures  int // consecutive

	probes      uint64
	transitions uint64
	lastProbe   time.Time
	lastResult  error
	lastError   error
	lastErrorAt time.Time
}

func newMachine(initial State, now time.Time) machine {
	return machine{state: initial, since: now}
}

// observe records one probe's result at now and reports whether the state
// changed. The first result decides at once when it disagrees with the
// initial state; later ones need rise consecutive successes to go up and
// fall consecutive failures to go down.
func (m *machine) observe(err error, now time.Time, rise, fall int) bool {
	first := m.probes == 0
	m.probes++
	m.lastProbe, m.lastResult = now, err
	if err == nil {
		m.successes++
		m.failures = 0
		if m.state == Down && (first || m.successes >= rise) {
			m.set(Up, now)
			return true
		}
		return false
	}
	m.failures++
	m.successes = 0
	m.lastError, m.lastErrorAt = err, now
	if m.state == Up && (first || m.failures >= fall) {
		m.set(Down, now)
		return true
	}
	return false
}

func (m *machine) set(s State, now time.Time) {
	m.state, m.since = s, now
	m.transitions++
}
