//go:build e2e && habench

package e2e

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestHAFailoverBench is the failover benchmark (test/vm/bench-ha.sh,
// part of make bench; never of make test): for vipd's pairs and
// keepalived's, in the same guest boot and with the same 100 ms
// advertisements, it fails the master again and again under load and
// reports, for each configuration, the time until the client's neighbour
// entry of the VIP names the backup (takeover) and until the first
// request is answered after the failure (n, p50, p99, max), the time
// from the master's return until the entry names it again (preemption),
// vipd's announcement path (from its master down timer handled to its
// announcements sent, from its log), failed requests and broken
// long-lived connections, then the ratios vipd/keepalived of each
// configuration. The master fails by its links cut through netlink
// ("cut"), by its links cut with ip(8) processes ("cutip"), or by its
// daemon killed. It fails only when a pair cannot be measured at all;
// the figures are the result.
func TestHAFailoverBench(t *testing.T) {
	n := 10
	if s := os.Getenv("VIPD_HA_BENCH_N"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	type row struct {
		Config      string    `json:"config"`
		Failure     string    `json:"failure"`
		N           int       `json:"n"`
		Done        int       `json:"done"`
		Stuck       string    `json:"stuck,omitempty"`
		MovedP50    float64   `json:"moved_p50_ms"`
		MovedP99    float64   `json:"moved_p99_ms"`
		MovedMax    float64   `json:"moved_max_ms"`
		FromDownP50 float64   `json:"moved_from_down_p50_ms"`
		FromDownP99 float64   `json:"moved_from_down_p99_ms"`
		DownP50     float64   `json:"down_p50_ms"`
		DownP99     float64   `json:"down_p99_ms"`
		BackP50     float64   `json:"back_p50_ms"`
		BackP99     float64   `json:"back_p99_ms"`
		PathP50     float64   `json:"announce_path_p50_ms,omitempty"`
		PathP99     float64   `json:"announce_path_p99_ms,omitempty"`
		WireP50     float64   `json:"wire_takeover_p50_ms"`
		WireP99     float64   `json:"wire_takeover_p99_ms"`
		WireN       int       `json:"wire_n"`
		MovedMS     []float64 `json:"moved_ms"`
		BackMS      []float64 `json:"back_ms"`
		WireMS      []float64 `json:"wire_takeover_ms"`
		ClaimP50    float64   `json:"claim_p50_ms"`
		ClaimP99    float64   `json:"claim_p99_ms"`
		ClaimMS     []float64 `json:"claim_ms"`
		PhaseMS     []float64 `json:"phase_ms"`
		AnswerP50   float64   `json:"answer_p50_ms"`
		AnswerP99   float64   `json:"answer_p99_ms"`
		Failed      int       `json:"failed"`
		FailedBack  int       `json:"failed_back"`
		Short       int       `json:"short"`
		Broken      int       `json:"broken"`
		LongConns   int       `json:"long_conns"`
		FirstError  string    `json:"first_error,omitempty"`
	}
	var rows []row
	var runs []benchRun
	// Each configuration runs for vipd, then for keepalived: the pairs
	// the table's ratios compare. "cut" takes the master's links down
	// through netlink, "cutip" with ip(8) processes.
	for _, mode := range []string{"dr", "nat", "snat"} {
		for _, how := range []string{"cut", "cutip"} {
			runs = append(runs,
				benchRun{pairOptions{Mode: mode, Sync: true}, how, n},
				benchRun{pairOptions{Mode: mode, Sync: true, Keepalived: true}, how, n},
				benchRun{pairOptions{Mode: mode, Sync: false, Scheduler: "wlc"}, how, n},
				benchRun{pairOptions{Mode: mode, Sync: false, Scheduler: "wlc", Keepalived: true}, how, n},
			)
		}
	}
	runs = append(runs,
		benchRun{pairOptions{Mode: "dr", Sync: true}, "kill", n},
		benchRun{pairOptions{Mode: "dr", Sync: true, Keepalived: true}, "kill", n},
	)
	ran := 0 // the subtests that ran: -run may name a subset
	for _, r := range runs {
		t.Run(strings.ReplaceAll(r.o.String()+" "+r.how, " ", "_"), func(t *testing.T) {
			ran++
			p := startPair(t, r.o)
			p.anchor, p.interval = true, advertInterval
			// The same points of the interval for vipd's pair and
			// keepalived's in a configuration (common random numbers):
			// the comparison of a row is then free of where its
			// failures fell.
			seed := fnv.New64a()
			fmt.Fprintf(seed, "%s %v %s %s", r.o.Mode, r.o.Sync, r.o.scheduler(), r.how)
			rng := rand.New(rand.NewPCG(seed.Sum64(), uint64(r.n)))
			var moved, answered, back, path, fromDown, down, wire, claim, phase []time.Duration
			out := row{Config: r.o.String(), Failure: r.how, N: r.n}
			for i := 0; i < r.n; i++ {
				// The i-th failure falls in the i-th n-th of an
				// advertisement interval (at a random point of it) after
				// one of the master's advertisements: every pair is
				// failed at every point of the interval alike.
				p.phase = time.Duration((float64(i) + rng.Float64()) / float64(r.n) * float64(advertInterval))
				res, err := p.failover(r.how)
				if err != nil {
					// The pair did not fail over (or back): counted, and
					// the series ends, the pair's state being unknown.
					out.Stuck = fmt.Sprintf("#%d: %v", i+1, err)
					t.Logf("%s %s #%d: %v", r.o, r.how, i+1, err)
					break
				}
				out.Done++
				moved = append(moved, res.Moved)
				fromDown = append(fromDown, res.MovedFromDown)
				down = append(down, res.Down)
				back = append(back, res.Back)
				if res.Announced > 0 {
					path = append(path, res.Announced)
				}
				if res.Announced > 20*time.Millisecond {
					// A slow announcement path, in the console log: where
					// its time went.
					t.Logf("%s %s #%d: announcement path %s: timer late %s, SNAT tracking %s (reading %d connections %s)",
						r.o, r.how, i+1, res.Announced, res.TimerLate, res.Adopting, res.AdoptListed, res.AdoptRead)
				}
				if res.Answered > 0 {
					answered = append(answered, res.Answered)
				}
				if res.Claimed > 0 {
					wire = append(wire, res.Claimed)
					claim = append(claim, res.LastAdvert+res.Claimed)
					phase = append(phase, -res.LastAdvert)
				}
				out.Failed += res.Failed
				out.FailedBack += res.FailedBack
				out.Broken += res.Broken
				out.Short += res.Short
				out.LongConns += 10
				if out.FirstError == "" && len(res.Errors) > 0 {
					out.FirstError = res.Errors[0]
				}
				t.Logf("%s %s #%d: failure made in %v (first link down at %v), backup elected %v (timer %v late, announced %v after it, %v of it tracking SNAT connections, %v reading %d connections), master %v, moved %v, answered %v, back %v, on the wire %v after the master's last advertisement (%v before the start), %d failed, %d broken", r.o, r.how, i+1,
					res.Failing.Round(time.Millisecond), res.Down.Round(time.Millisecond), res.Elected.Round(time.Millisecond), res.TimerLate.Round(time.Millisecond), res.Announced.Round(time.Microsecond), res.Adopting.Round(time.Microsecond), res.AdoptRead.Round(time.Microsecond), res.AdoptListed, res.Master.Round(time.Millisecond), res.Moved.Round(time.Millisecond), res.Answered.Round(time.Millisecond), res.Back.Round(time.Millisecond), res.Claimed.Round(100*time.Microsecond), -res.LastAdvert.Round(100*time.Microsecond), res.Failed+res.FailedBack, res.Broken)
			}
			out.MovedP50, out.MovedP99, out.MovedMax = quantileMS(moved, 0.5), quantileMS(moved, 0.99), quantileMS(moved, 1)
			out.FromDownP50, out.FromDownP99 = quantileMS(fromDown, 0.5), quantileMS(fromDown, 0.99)
			out.DownP50, out.DownP99 = quantileMS(down, 0.5), quantileMS(down, 0.99)
			out.BackP50, out.BackP99 = quantileMS(back, 0.5), quantileMS(back, 0.99)
			out.PathP50, out.PathP99 = quantileMS(path, 0.5), quantileMS(path, 0.99)
			out.AnswerP50, out.AnswerP99 = quantileMS(answered, 0.5), quantileMS(answered, 0.99)
			out.WireP50, out.WireP99, out.WireN = quantileMS(wire, 0.5), quantileMS(wire, 0.99), len(wire)
			out.MovedMS, out.BackMS, out.WireMS = millis(moved), millis(back), millis(wire)
			out.ClaimP50, out.ClaimP99, out.ClaimMS = quantileMS(claim, 0.5), quantileMS(claim, 0.99), millis(claim)
			out.PhaseMS = millis(phase)
			rows = append(rows, out)
		})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-34s %-7s %3s  %-24s  %-22s  %-16s  %-16s  %-16s  %-13s  %-17s  %-21s  %-23s  %s\n", "pair", "failure", "n", "neighbour moved p50/p99/max", "moved from down p50/p99", "down at p50/p99", "back p50/p99", "answered p50/p99", "failed/back/short", "broken/long conns", "announce path p50/p99", "on the wire p50/p99 (n)", "ARP from the start p50/p99")
	for _, r := range rows {
		ans := "-"
		if r.Failure != "kill" {
			ans = fmt.Sprintf("%.0f/%.0f ms", r.AnswerP50, r.AnswerP99)
		}
		path := "-"
		if r.PathP50 > 0 {
			path = fmt.Sprintf("%.1f/%.1f ms", r.PathP50, r.PathP99)
		}
		fmt.Fprintf(&b, "%-34s %-7s %3d  %-24s  %-22s  %-16s  %-16s  %-16s  %-13s  %-17s  %-21s  %-23s  %s\n", r.Config, r.Failure, r.Done,
			fmt.Sprintf("%.0f/%.0f/%.0f ms", r.MovedP50, r.MovedP99, r.MovedMax), fmt.Sprintf("%.0f/%.0f ms", r.FromDownP50, r.FromDownP99),
			fmt.Sprintf("%.0f/%.0f ms", r.DownP50, r.DownP99), fmt.Sprintf("%.0f/%.0f ms", r.BackP50, r.BackP99), ans,
			fmt.Sprintf("%d/%d/%d", r.Failed, r.FailedBack, r.Short), fmt.Sprintf("%d/%d", r.Broken, r.LongConns), path, fmt.Sprintf("%.1f/%.1f ms (%d)", r.WireP50, r.WireP99, r.WireN), fmt.Sprintf("%.0f/%.0f ms", r.ClaimP50, r.ClaimP99))
	}
	// The ratios vipd/keepalived of each configuration both ran: below 1
	// vipd is faster.
	b.WriteString("\nratio vipd/keepalived (takeover = neighbour moved, from the start of the failure and from the master's first link down; preemption = back; ARP from the start = from the start of the failure to the backup's first ARP for the VIP on the client's LAN (capture time: the takeover as the neighbour moved measures it, without the client's monitor process); on the wire = from the master's last advertisement to that ARP, and that minus the master down interval):\n")
	for _, v := range rows {
		if strings.HasPrefix(v.Config, "keepalived") || v.Done == 0 {
			continue
		}
		for _, k := range rows {
			if k.Config != "keepalived"+strings.TrimPrefix(v.Config, "vipd") || k.Failure != v.Failure || k.Done == 0 {
				continue
			}
			fmt.Fprintf(&b, "%-34s %-7s n %d/%d  takeover p50 %.2f p99 %.2f  from down p50 %.2f p99 %.2f  preemption p50 %.2f p99 %.2f  ARP from the start p50 %.2f p99 %.2f  on the wire p50 %.2f p99 %.2f (past %.0f ms: %.1f/%.1f against %.1f/%.1f ms)  failures after an advertisement p50 %.0f/%.0f ms\n",
				strings.TrimPrefix(v.Config, "vipd "), v.Failure, v.Done, k.Done,
				v.MovedP50/k.MovedP50, v.MovedP99/k.MovedP99, v.FromDownP50/k.FromDownP50, v.FromDownP99/k.FromDownP99, v.BackP50/k.BackP50, v.BackP99/k.BackP99, v.ClaimP50/k.ClaimP50, v.ClaimP99/k.ClaimP99,
				v.WireP50/k.WireP50, v.WireP99/k.WireP99, masterDownMS, v.WireP50-masterDownMS, v.WireP99-masterDownMS, k.WireP50-masterDownMS, k.WireP99-masterDownMS, quantile(v.PhaseMS, 0.5), quantile(k.PhaseMS, 0.5))
		}
	}
	// Every configuration's failovers pooled, by how the master failed:
	// more failovers than any one row, the same configurations on both
	// sides.
	b.WriteString("\npooled by failure (p50/p99 ms, n):\n")
	for _, how := range []string{"cut", "cutip", "kill"} {
		var pool [2][4][]float64 // [vipd, keepalived][moved, claim, back, wire]
		for _, r := range rows {
			if r.Failure != how {
				continue
			}
			w := 0
			if strings.HasPrefix(r.Config, "keepalived") {
				w = 1
			}
			pool[w][0] = append(pool[w][0], r.MovedMS...)
			pool[w][1] = append(pool[w][1], r.ClaimMS...)
			pool[w][2] = append(pool[w][2], r.BackMS...)
			pool[w][3] = append(pool[w][3], r.WireMS...)
		}
		if len(pool[0][0]) == 0 || len(pool[1][0]) == 0 {
			continue
		}
		fmt.Fprintf(&b, "%-7s", how)
		for i, what := range []string{"takeover", "ARP from the start", "preemption", "on the wire"} {
			v, k := pool[0][i], pool[1][i]
			if len(v) == 0 || len(k) == 0 {
				continue
			}
			fmt.Fprintf(&b, "  %s vipd %.1f/%.1f (%d) keepalived %.1f/%.1f (%d) ratio %.2f/%.2f", what,
				quantile(v, 0.5), quantile(v, 0.99), len(v), quantile(k, 0.5), quantile(k, 0.99), len(k),
				quantile(v, 0.5)/quantile(k, 0.5), quantile(v, 0.99)/quantile(k, 0.99))
		}
		b.WriteString("\n")
	}
	for _, r := range rows {
		if r.Stuck != "" {
			fmt.Fprintf(&b, "%s %s: %d of %d failovers, then %s\n", r.Config, r.Failure, r.Done, r.N, r.Stuck)
		}
	}
	js, _ := json.MarshalIndent(rows, "", "  ")
	// The markers let bench-ha.sh take the table and JSON from the console.
	fmt.Printf("HA-BENCH-TABLE-BEGIN\n%sHA-BENCH-TABLE-END\nHA-BENCH-JSON-BEGIN\n%s\nHA-BENCH-JSON-END\n", b.String(), js)
	if len(rows) != ran {
		t.Fatalf("%d of %d pairs measured", len(rows), ran)
	}
}

// benchRun is one configuration of the benchmark: a pair, how its
// master fails, and how many times.
type benchRun struct {
	o   pairOptions
	how string
	n   int
}

// advertInterval is the pairs' VRRP advertisement interval, and
// masterDownMS the backup's (priority 100) master down interval in
// milliseconds: three intervals and the skew time (RFC 9568).
const (
	advertInterval = 100 * time.Millisecond
	masterDownMS   = 3*100 + (256-100)*100.0/256
)

// millis returns ds in milliseconds.
func millis(ds []time.Duration) []float64 {
	ms := make([]float64, len(ds))
	for i, d := range ds {
		ms[i] = float64(d) / float64(time.Millisecond)
	}
	return ms
}

// quantile returns the q quantile of v (nearest rank).
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// quantileMS returns the q quantile of ds (nearest rank) in milliseconds.
func quantileMS(ds []time.Duration, q float64) float64 {
	return quantile(millis(ds), q)
}
